.PHONY: setup dev run test lint check lock bench messages

# Install everything, migrate, then run web + worker + beat in the foreground.
dev: setup run

setup:
	scripts/setup.sh

# honcho numbers its processes' ports from --port: the web process gets exactly PORT.
run:
	@mkdir -p var
	@echo "\n==> Le Bureau: Mission Control at http://$${HOST:-127.0.0.1}:$${PORT:-8000}/  (API docs: /api/docs/, admin: /admin/)\n"
	.venv/bin/honcho start --port $${PORT:-8000}

# The lint CI holds the code to, then the whole suite on real PostgreSQL, Redis and a real Celery worker.
test: setup check
	.venv/bin/pytest

check:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

lint:
	.venv/bin/pre-commit run --all-files

MESSAGES_IGNORE = $(foreach d,.venv sdk node_modules staticfiles image-build tests bench examples \
    missioncontrol/static/vendor,--ignore '$(d)/*')
# Gather the strings to translate into locale/*/LC_MESSAGES/django.po (with the `_lazy` ones).
messages:
	.venv/bin/python manage.py makemessages -l fr --no-obsolete $(MESSAGES_IGNORE)
	.venv/bin/python manage.py makemessages -l fr --no-obsolete -d djangojs $(MESSAGES_IGNORE)
	.venv/bin/python manage.py compilemessages --ignore .venv -v 0

# Renew the lock file after changing the dependencies in pyproject.toml.
lock:
	.venv/bin/pip install -q pip-tools
	.venv/bin/pip-compile -q --extra dev --generate-hashes --allow-unsafe --strip-extras \
	    --no-emit-index-url --no-emit-find-links -o requirements.lock pyproject.toml

# Every bench, one after the other, as root: one table, written to docs/benchmarks/.
bench: setup
	.venv/bin/python bench/run.py
