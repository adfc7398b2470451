"""The API token of ``jobctl serve``: where it comes from, whether it is strong
enough, and reading it again when its file changes (a token rotated without a
restart).

A token is refused at start-up when, at the most generous estimate, it holds fewer
than 128 bits: its length times log2 of the alphabet its characters are drawn from
(lower case, upper case, digits, other printable ASCII: 26, 26, 10 and 32 symbols),
or, for a token of fewer than 10 distinct characters, of those characters; and no
more than what is left once its patterns are taken out: a stretch that repeats an
earlier one (``abcabc...``, ``0123456789`` over and over) or carries on a sequence
(``abcdefgh``, ``13579``) counts as one reference, about 2 log2(length) bits,
however long it is. The 43-character ``secrets.token_urlsafe(32)`` the message
recommends (256 bits) always passes, ``secrets.token_hex(32)`` too; a
password-like word does not. ``secrets.token_hex(16)`` holds exactly 128 bits, with
no margin for the estimate: one in about 10,000 draws only 9 of the 16 hex digits
and is refused (make another). The estimate cannot see that a long token is a
sentence: make tokens with ``secrets``.
"""

from __future__ import annotations

import logging
import math
import os
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hybrid_jobs import defaults
from hybrid_jobs.plumbing.config import ConfigError

log = logging.getLogger("jobctl")

TOKEN_SETTING: Final = "JOBCTL_API_TOKEN"  # noqa: S105 (the variable's name)
MIN_TOKEN_BITS: Final = defaults.MIN_TOKEN_BITS
MAKE_ONE: Final = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
_CLASSES: Final = (
    frozenset(string.ascii_lowercase),
    frozenset(string.ascii_uppercase),
    frozenset(string.digits),
    frozenset(string.punctuation),
)
# Below this many distinct characters, the estimate counts those characters rather
# than the classes they belong to ("aA1!bBa1A!..." is not 6.6 bits a character).
_FEW_DISTINCT: Final = 10


# A repeat or a sequence is counted as one reference from this many characters on
# (shorter ones are left to chance: a random token has a few), looking back at most
# _WINDOW characters for a repeat (which keeps the estimate linear in the length).
_PATTERN_MIN: Final = 3
_WINDOW: Final = 256


def estimated_bits(token: str) -> float:
    """An upper bound on the token's entropy, in bits (see the module's docstring)."""
    if not token:
        return 0.0
    alphabet = sum(len(c) for c in _CLASSES if c & set(token))
    distinct = len(set(token))
    if distinct < _FEW_DISTINCT:
        alphabet = min(alphabet, distinct)
    if alphabet <= 1:
        return 0.0
    per_character = math.log2(alphabet)
    return min(len(token) * per_character, _patterned_bits(token, per_character))


def _patterned_bits(token: str, per_character: float) -> float:
    """The token's bits with its patterns counted once: going left to right, the
    longest stretch that repeats one starting up to _WINDOW characters back or
    carries on the step between the two characters before it (``cdef`` after ``ab``,
    ``7`` after ``35``) costs one reference, any other character ``per_character``."""
    codes = [ord(c) for c in token]
    size = len(codes)
    reference = 2 * math.log2(size) if size > 1 else 0.0
    bits, at = 0.0, 0
    while at < size:
        longest = 0
        for start in range(max(0, at - _WINDOW), at):
            length = 0
            while at + length < size and codes[start + length] == codes[at + length]:
                length += 1
            longest = max(longest, length)
        if at >= 2:
            step, length = codes[at - 1] - codes[at - 2], 0
            while at + length < size and codes[at + length] - codes[at + length - 1] == step:
                length += 1
            longest = max(longest, length)
        if longest >= _PATTERN_MIN:
            bits, at = bits + min(reference, longest * per_character), at + longest
        else:
            bits, at = bits + per_character, at + 1
    return bits


def checked(token: str, setting: str) -> str:
    """``token`` if it is printable ASCII without spaces and strong enough; else a
    ConfigError naming ``setting`` and saying how to make a good one."""
    if any(c.isspace() for c in token) or not token.isascii() or not token.isprintable():
        raise ConfigError(f"{setting} must be printable ASCII without spaces")
    bits = estimated_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise ConfigError(
            f"{setting} is too weak to guard payloads (about {bits:.0f} bits; at least"
            f" {MIN_TOKEN_BITS} needed): make one with `{MAKE_ONE}`"
        )
    return token


@dataclass(frozen=True)
class _Stamp:
    """What says a file changed: its inode, size and modification time."""

    inode: int
    size: int
    mtime_ns: int


def _stamp(path: Path) -> _Stamp | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return _Stamp(found.st_ino, found.st_size, found.st_mtime_ns)


class Tokens:
    """The token every check compares with. A fixed one (JOBCTL_API_TOKEN, or a
    test's), or the contents of a file (JOBCTL_API_TOKEN_FILE), read again whenever
    the file changes. A changed file whose new contents are not a usable token
    (empty, weak, unreadable) makes ``current()`` None, and every check fails, until
    it is fixed: the server never falls back to an old token nor to no token."""

    def __init__(self, token: str | None = None, path: Path | None = None) -> None:
        self._token = token
        self._path = path
        self._stamp = None if path is None else _stamp(path)
        self._broken = False

    @classmethod
    def fixed(cls, token: str) -> Tokens:
        return cls(token)

    @classmethod
    def from_file(cls, path: Path) -> Tokens:
        """Read now: a file that does not hold a usable token stops the start."""
        setting = f"{TOKEN_SETTING}_FILE"
        try:
            text = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror}") from None
        if not text:
            raise ConfigError(f"{setting}: {path} is empty")
        return cls(checked(text, setting), path)

    @property
    def path(self) -> Path | None:
        return self._path

    def current(self) -> str | None:
        """The token to compare with now; None while the token file holds none."""
        if self._path is not None:
            stamp = _stamp(self._path)
            if stamp != self._stamp:
                self._stamp = stamp
                self._reread(self._path)
        return None if self._broken else self._token

    def _reread(self, path: Path) -> None:
        setting = f"{TOKEN_SETTING}_FILE"
        try:
            text = path.read_text(encoding="utf-8").strip()
            if not text:
                raise ConfigError(f"{setting}: {path} is empty")
            token = checked(text, setting)
        except OSError as exc:
            problem = f"{setting}: cannot read {path}: {exc.strerror}"
        except ConfigError as exc:
            problem = str(exc)
        else:
            changed = token != self._token or self._broken
            self._token, self._broken = token, False
            if changed:
                log.info("api.token_changed", extra={"file": str(path)})
            return
        if not self._broken:
            log.error(
                "api.token_unusable",
                extra={"detail": problem, "action": "refusing every request that needs it"},
            )
        self._broken = True


def token_from_environment() -> Tokens | None:
    """From $JOBCTL_API_TOKEN, else the file $JOBCTL_API_TOKEN_FILE names (read again
    when it changes); None when neither is set. Never logged."""
    value = os.environ.get(TOKEN_SETTING, "").strip()
    if value:
        return Tokens.fixed(checked(value, TOKEN_SETTING))
    path = os.environ.get(f"{TOKEN_SETTING}_FILE", "").strip()
    if path:
        return Tokens.from_file(Path(path))
    return None
