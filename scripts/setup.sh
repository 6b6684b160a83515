#!/usr/bin/env bash
# Installs and prepares everything the control plane needs on a Debian/Ubuntu machine, as root.
# Idempotent: a second run only checks. Used by `make dev`, `make test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "System packages"
# Services, the browser libraries' toolchain, and what the tests dial: a real VNC server with an
# xterm on it, sshd, xclip to read a screen's clipboard, tmux for the terminal every viewer shares, and
# Chromium for the browser tests.
scripts/apt-ensure.sh postgresql redis-server python3-venv tigervnc-standalone-server xterm xclip tmux \
    openssh-server chromium gettext
# Any Node.js with npm will do for the browser libraries; Debian's only if there is none.
command -v npm >/dev/null || scripts/apt-ensure.sh nodejs npm
echo "ok"

step "PostgreSQL and Redis"
scripts/services.sh
echo "ok"

step "Python environment (.venv)"
[ -x .venv/bin/python ] || python3 -m venv .venv
# From the lock file, hashes checked: every machine gets the same packages (`make lock` renews it).
.venv/bin/pip install -q --disable-pip-version-check --require-hashes -r requirements.lock
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
# The SDK, CLI and MCP server, a package of their own (their dependencies are in the lock, via the dev extra).
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e sdk/python
echo "ok"

step "Desktop host: LXC, its bridge and firewall"
image-build/host-setup.sh --python .venv/bin/python

step "Golden desktop images (minimal for tests, full for users)"
# Rebuilt only when the image's recipe changed since the current build.
recipe=$(cat image-build/build.sh image-build/configure-guest.sh image-build/shift_ids.py image-build/guest/* |
    sha256sum | cut -c1-16)
for profile in ${IMAGE_PROFILES:-minimal full}; do
    stamp=/var/lib/lebureau/images/$profile/current/recipe
    if [ "$(cat "$stamp" 2>/dev/null)" = "$recipe" ]; then
        echo "$profile: up to date ($(readlink -f "$(dirname "$stamp")"))"
    else
        image-build/build.sh "$profile"
        echo "$recipe" >"$stamp"
    fi
done
# The VM disk for a Proxmox template, from the same build (the boot test needs the minimal one).
for profile in ${VM_PROFILES:-minimal}; do
    image-build/build-qcow2.sh "$profile"
done

step "Configuration (.env)"
if [ ! -f .env ]; then
    .venv/bin/python - <<'PY'
import base64, secrets
from pathlib import Path
Path(".env").write_text(
    "DJANGO_DEBUG=true\n"
    f"SECRET_KEY={secrets.token_urlsafe(50)}\n"
    f"API_KEY_HMAC_SECRET={secrets.token_urlsafe(32)}\n"
    f"LLM_KEY_ENCRYPTION_KEYS={base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()}\n"
)
PY
    chmod 600 .env
    echo "wrote .env with fresh secrets"
else
    echo "keeping the existing .env"
fi

step "Database"
db_name=$(.venv/bin/python -c "from lebureau.settings import DATABASES as d; print(d['default']['NAME'])")
su postgres -c "psql -tAc \"SELECT 1 FROM pg_database WHERE datname='$db_name'\"" | grep -q 1 \
    || su postgres -c "createdb '$db_name'"
.venv/bin/python manage.py migrate --noinput -v 0
echo "ok"

step "Translations (locale/*.po into .mo)"
.venv/bin/python manage.py compilemessages --ignore .venv -v 0
echo "ok"

step "Browser libraries (noVNC, xterm.js) into static files"
scripts/static.sh
.venv/bin/python manage.py collectstatic --noinput -v 0
echo "ok"

step "First admin"
if [ -n "${DJANGO_SUPERUSER_EMAIL:-}" ] && [ -n "${DJANGO_SUPERUSER_PASSWORD:-}" ]; then
    DJANGO_SUPERUSER_USERNAME="${DJANGO_SUPERUSER_USERNAME:-$DJANGO_SUPERUSER_EMAIL}" \
        .venv/bin/python manage.py createsuperuser --noinput 2>/dev/null && echo "created $DJANGO_SUPERUSER_EMAIL" \
        || echo "$DJANGO_SUPERUSER_EMAIL already exists"
else
    echo "none created: set DJANGO_SUPERUSER_EMAIL and DJANGO_SUPERUSER_PASSWORD, or run"
    echo "  .venv/bin/python manage.py createsuperuser"
fi
