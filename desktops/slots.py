"""Slots counted in Redis, shared by every process: at most `limit` holders of a key at once (one
person's long calls, one workspace's notifications). A slot is its holder's deadline in a sorted set,
so one that a crashed process never gave back frees itself then."""

from __future__ import annotations

import functools
import secrets
import time

import redis
from django.conf import settings

# Answers [1] with the slot taken, else [0, seconds until the first holder's deadline].
TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tostring(tonumber(first[2]) - tonumber(ARGV[1]))}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) - tonumber(ARGV[1])) + 1)
return {1}
"""


@functools.cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])


@functools.cache
def _take():
    return _redis().register_script(TAKE)


def slot_take(*, key: str, limit: int, seconds: float) -> tuple[str | None, float]:
    """A slot of `key` for at most `seconds`: its token, or None and how long until one may free."""
    token, now = secrets.token_hex(8), time.time()
    answer = _take()(keys=[f"lebureau:slots:{key}"], args=[now, now + seconds, limit, token])
    if int(answer[0]):
        return token, 0.0
    return None, float(answer[1])


def slot_free(*, key: str, token: str) -> None:
    _redis().zrem(f"lebureau:slots:{key}", token)
