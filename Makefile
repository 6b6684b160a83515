.PHONY: setup dev run test lint

# Install everything, migrate, then run web + worker + beat in the foreground.
dev: setup run

setup:
	scripts/setup.sh

run:
	@mkdir -p var
	@echo "\n==> Le Bureau: Mission Control at http://$${HOST:-127.0.0.1}:$${PORT:-8000}/  (API docs: /api/docs/, admin: /admin/)\n"
	.venv/bin/honcho start

# The whole suite, on real PostgreSQL, Redis and a real Celery worker.
test: setup
	.venv/bin/pytest

lint:
	.venv/bin/pre-commit run --all-files
