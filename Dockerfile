FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends openssh-client lxc \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml ./
COPY lebureau lebureau
COPY desktops desktops
COPY workers workers
COPY proxies proxies
COPY missioncontrol missioncontrol
COPY billing billing
COPY templates templates
COPY manage.py ./
RUN pip install --no-cache-dir . && python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "lebureau.asgi:application"]
