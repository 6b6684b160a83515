# The browser libraries (noVNC, xterm.js) come from npm, pinned by package-lock.json.
FROM node:20-bookworm-slim AS browser-libraries
WORKDIR /app
COPY package.json package-lock.json ./
COPY scripts/static.sh scripts/static.sh
RUN scripts/static.sh

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends openssh-client lxc gettext \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml requirements.lock ./
RUN pip install --no-cache-dir --require-hashes -r requirements.lock
COPY lebureau lebureau
COPY desktops desktops
COPY workers workers
COPY proxies proxies
COPY missioncontrol missioncontrol
COPY billing billing
COPY templates templates
COPY locale locale
COPY manage.py ./
COPY --from=browser-libraries /app/missioncontrol/static/vendor missioncontrol/static/vendor
RUN pip install --no-cache-dir --no-deps . && python manage.py collectstatic --noinput \
    && python manage.py compilemessages -v 0
EXPOSE 8000
# The web server takes its database connections from a pool (see DATABASE_POOL_MAX in the settings).
CMD ["sh", "-c", "DATABASE_POOL_MAX=${DATABASE_POOL_MAX:-20} exec nice -n ${WEB_NICE:--10} python -m lebureau.server -b 0.0.0.0 -p 8000 lebureau.asgi:application"]
