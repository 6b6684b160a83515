"""Benches run on a database of their own (`BENCH_DATABASE_URL`, `lebureau_bench` by default).

Sharing the development database once let a development server's `reconcile` judge a running
bench's desktops; a bench's thousand rows would also show up in the developer's pages.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

DEFAULT = "postgres://postgres@127.0.0.1:5432/lebureau_bench"


def django_setup() -> None:
    """Point this process (and the daphne and workers it starts) at the bench database, migrated."""
    url = os.environ.setdefault("BENCH_DATABASE_URL", DEFAULT)
    os.environ["DATABASE_URL"] = url
    # Figures are for the server as deployed: the development .env's debug mode records every query.
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lebureau.settings")
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    vacuum_analyze()


def vacuum_analyze(*tables: str) -> None:
    """The tables (all by default) as autovacuum keeps a live server's: earlier runs' dead rows gone,
    the planner's statistics up to date. Autovacuum is off on some machines (this one), and a table
    bloated by past runs, or with rows its statistics do not know of, makes every figure drift."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.SQL(", ").join(map(sql.Identifier, tables))))
