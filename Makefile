# make run   create .venv if missing, install with pinned versions, run the default experiment
# make test  same set-up, then the formatter and linter checks, then the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedsim-installed

.PHONY: run test install clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet pip==26.3
	# setuptools says that every editable install is one (an information, not a defect): that line alone is silenced
	PYTHONWARNINGS='ignore:Editable installation' $(PY) -m pip install --quiet -c constraints.txt -e '.[test,detection]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/fedsim run $(ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/ruff check --quiet .
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
