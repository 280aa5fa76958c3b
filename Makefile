# ViT Lab: the two commands a reader needs are `make book` and `make test`.
# Everything runs inside a local virtual environment that the first command creates.

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# `make test` runs pytest in two worker processes (pytest-xdist): each test goes to whichever
# worker is free, except groups that must share one (--dist loadgroup, tests/conftest.py):
# a notebook's cells (nbval runs them in order in one kernel), the book's tests (one build for
# test_book.py and test_browser.py) and the grader's kernel tests. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2
XDIST  := -n $(PYTEST_WORKERS) --dist loadgroup

.PHONY: help install mathjax lint test test-fast test-gpu execute book book-all book-online translations chapter-times reading-times clean

help:
	@echo "make install    create $(VENV) and install the requirements and vitlab (editable)"
	@echo "make mathjax    install MathJax with npm ci and copy it into book/_static (the book serves it)"
	@echo "make lint       ruff (lint + format) and pyright over vitlab, grader, tests and benchmarks; ruff over the notebooks"
	@echo "make test       lint, unit tests, the book build and every notebook against its stored outputs"
	@echo "make test-fast  unit tests only (tests/), without the slow ones (book, browser, notebook runs, fresh venv)"
	@echo "make test-gpu   the notebooks against their stored outputs on a CUDA GPU"
	@echo "make execute    re-run every notebook in place (regenerates the stored outputs)"
	@echo "make book       build the book into _build/html (offline: the stored outputs as they are)"
	@echo "make book-all   build the English, Korean and Chinese editions: _build/html, _build/html/ko, _build/html/zh"
	@echo "make book-online  run the cells that need the internet for real, then build all three editions (what is published)"
	@echo "make translations  re-extract the book's messages and update the Korean and Chinese catalogues (book/locales)"
	@echo "make chapter-times  run each notebook alone in a fresh kernel and print how long it takes"
	@echo "make reading-times  how long each chapter's main path takes to read (prose and visible code)"
	@echo "make clean      remove build outputs (keeps $(VENV))"

# Re-installs only when a requirements file or a pyproject.toml changes. Both packages are
# installed editable: vitlab (the students') and vitlab-grader (grader/, the instructor's).
# uv installs the wheels in parallel (on 2 cores about 35 s, where pip takes about 95 s). It
# reads no pip configuration file, so the indexes, links and constraints pip is set up with
# (`pip config list`) are handed on, and it picks among indexes as pip does (best match).
PIP_CONFIG_AS_UV := awk -F= '{ n = split($$1, key, "."); name = key[n]; value = substr($$0, index($$0, "=") + 1); \
	gsub(/\047/, "", value); if (name ~ /^(index-url|extra-index-url|find-links|constraint)$$/) \
	{ m = split(value, each, " "); for (i = 1; i <= m; i++) printf "--%s %s ", name, each[i] } }'
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml grader/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install "uv>=0.5"
	$(VENV)/bin/uv pip install --python $(PY) --compile-bytecode --index-strategy unsafe-best-match \
		$$($(PY) -m pip config list | $(PIP_CONFIG_AS_UV)) -r requirements-dev.txt -e . -e ./grader
	touch $@

install: $(STAMP)

# The book serves its own MathJax (mathjax_path in _config.yml), so math renders with no
# network. The version is pinned in package.json and package-lock.json; node_modules and the
# copy in book/_static/mathjax are build outputs (gitignored). Only what the page loads is
# copied: the combined component, the TeX/MathML inputs with their extensions (TeX's
# autoload fetches them on demand), the CHTML fonts, and the menu and accessibility parts.
MATHJAX_SRC := node_modules/mathjax/es5
MATHJAX     := book/_static/mathjax
$(MATHJAX)/tex-mml-chtml.js: package.json package-lock.json
	npm ci --no-audit --no-fund
	rm -rf $(MATHJAX)
	mkdir -p $(MATHJAX)/output
	cp -R $(MATHJAX_SRC)/tex-mml-chtml.js $(MATHJAX_SRC)/input $(MATHJAX_SRC)/ui \
		$(MATHJAX_SRC)/a11y $(MATHJAX_SRC)/sre $(MATHJAX)/
	cp -R $(MATHJAX_SRC)/output/chtml $(MATHJAX_SRC)/output/chtml.js $(MATHJAX)/output/
	cp node_modules/mathjax/LICENSE $(MATHJAX)/
	touch $@

mathjax: $(MATHJAX)/tex-mml-chtml.js

# The browser tests (tests/test_browser.py) drive Debian's Chromium at /usr/bin/chromium and
# skip, saying why, where it is missing; .ci/run installs it and makes its absence a failure.
# ruff and pyright are configured in pyproject.toml; notebooks/ruff.toml keeps the notebooks'
# code within the book's 79-column code blocks.
lint: $(STAMP)
	$(VENV)/bin/ruff check vitlab grader tests benchmarks book/_scripts book/_ext
	$(VENV)/bin/ruff format --check vitlab grader tests benchmarks book/_scripts book/_ext
	$(VENV)/bin/ruff check notebooks
	$(VENV)/bin/pyright --threads 2

test: $(STAMP) mathjax lint
	$(PY) -m pytest $(XDIST) tests notebooks $(NBVAL)

# The tests marked slow (tests/conftest.py) are left out: the book build and the browser, the
# notebook runs, the fresh environment, the grader's kernels, torch.compile, and the reference
# logits of every preset (tests/test_contract.py keeps one reference check per family).
test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) tests -m "not slow"

# CI has no GPU: run this by hand on a CUDA machine. The stored outputs are
# device-independent, so the same notebooks must pass there too, with the torch version
# that made them (README: another version draws other random initial weights).
test-gpu: $(STAMP)
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu needs a CUDA GPU, and torch.cuda.is_available() is False here')"
	$(PY) -m pytest notebooks $(NBVAL)

execute: $(STAMP)
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 \
		notebooks/*.ipynb

book: $(STAMP) mathjax
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

# The Korean and Chinese editions: the same build with language=ko / zh_CN and the catalogues
# in book/locales (book/_scripts/editions.py says how), under _build/html/ko and _build/html/zh.
book-all: $(STAMP) mathjax
	$(PY) book/_scripts/editions.py

# After editing a chapter or page: re-extract its messages, merge them into every .po file
# (new messages are empty, changed ones fuzzy), and list what is left to translate. The
# leading "-" keeps make going when that list is over the 2 % the tests allow.
translations: $(STAMP)
	$(PY) book/_scripts/translations.py extract
	-$(PY) book/_scripts/translations.py status

# What the publishing workflow runs: a staged copy of the book whose notebooks with
# %%needs_internet cells run online (a failed download stops it, naming the model), then
# the same strict build as `make book`, into _build/html. The working tree is not changed.
book-online: $(STAMP) mathjax
	$(PY) book/_scripts/online_book.py

chapter-times: $(STAMP)
	$(PY) benchmarks/chapter_times.py

reading-times: $(STAMP)
	$(PY) benchmarks/reading_time.py

clean:
	rm -rf _build .pytest_cache node_modules $(MATHJAX)
	find vitlab grader tests notebooks -name __pycache__ -type d -prune -exec rm -rf {} +
	find notebooks -name .ipynb_checkpoints -type d -prune -exec rm -rf {} +
