# refcg: every target creates .venv (python3.11) if missing and installs the project into it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.refcg-installed
SOURCES := pyproject.toml $(wildcard refcodegen/*.py templates/* runtime/*)
export TOPHUB_LOCATION := NONE

.PHONY: demo test bench install clean

demo: $(STAMP)
	$(BIN)/python tools/demo.py

# tests run against the installed package (no source tree on sys.path)
test: $(STAMP)
	cd tests && ../$(BIN)/python -c "import refcodegen as r; assert 'site-packages' in r.__file__, r.__file__"
	cd tests && ../$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python tools/bench.py

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=23" setuptools wheel

# First install pulls dependencies; later ones only rebuild refcodegen (non-editable: tests
# import the installed package, templates/ and runtime/ included).
$(STAMP): $(BIN)/python $(SOURCES)
	$(BIN)/pip install -q --no-build-isolation ".[test]"
	rm -rf build
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
