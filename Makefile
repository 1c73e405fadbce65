# make run   create .venv if missing, install with pinned versions, run the default experiment
# make test  same set-up, then the formatter and linter checks, then the test suite
# make docs  the API reference, built by pdoc from the docstrings of the public modules into build/api/ (not committed)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedsim-installed

.PHONY: run test install docs clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet pip==26.3
	# setuptools says that every editable install is one (an information, not a defect): that line alone is silenced
	PYTHONWARNINGS='ignore:Editable installation' $(PY) -m pip install --quiet -c constraints.txt -e '.[test,detection,search]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/fedsim run $(ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/ruff check --quiet .
	$(PY) -m pytest -q $(PYTEST_ARGS)

# the modules of the API reference: a user's entry points and what a method, benchmark or model of one's own touches
# ('!pattern' drops the submodules the name before it brought in); tests/test_api_reference.py builds this list
API_MODULES := fedsim '!fedsim\..' fedsim.api fedsim.config fedsim.registry fedsim.errors fedsim.seeding \
	fedsim.messages fedsim.runtime.context fedsim.methods.base fedsim.methods.common.aggregation \
	fedsim.methods.common.classifier fedsim.methods.common.training fedsim.data.base fedsim.data.scenario \
	fedsim.data.benchmarks.splits fedsim.models '!fedsim\.models\.' fedsim.models.classifier
API_OUT ?= build/api

docs: $(STAMP)
	$(PY) -m pdoc -o $(API_OUT) $(API_MODULES)

clean:
	rm -rf $(VENV) runs .pytest_cache
