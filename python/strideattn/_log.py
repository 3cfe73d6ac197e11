"""The library's log in Python: records go to logging.getLogger("strideattn") (levels ERROR,
WARNING, INFO, DEBUG), or, while no logging handler is configured anywhere, to stderr as the
C++ library writes them ("[strideattn] ..."). The level starts from STRIDEATTN_LOG and
set_log_level() changes it; nothing is logged while it is "off" (the default)."""

import atexit
import logging
import sys

from . import _ext

logger = logging.getLogger("strideattn")

# The library's levels (strideattn::LogLevel) as Python logging levels.
_TO_PYTHON = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG}
_PREFIX = {1: "error: ", 2: "warning: "}


def _forward(level: int, message: str) -> None:
    # Called by the extension with the GIL held, from any thread that called the library.
    if logger.hasHandlers():
        logger.log(_TO_PYTHON.get(level, logging.INFO), message)
    else:
        sys.stderr.write(f"[strideattn] {_PREFIX.get(level, '')}{message}\n")


def _level_name(level) -> str:
    if level is None:
        return "off"
    if isinstance(level, bool):
        raise TypeError("log level must be a name, a logging level number or None, not a bool")
    if isinstance(level, int):  # a Python logging level: DEBUG, INFO, WARNING, ERROR, ...
        for name, number in (
            ("debug", logging.DEBUG),
            ("info", logging.INFO),
            ("warn", logging.WARNING),
            ("error", logging.CRITICAL),
        ):
            if level <= number:
                return name
        return "off"
    if isinstance(level, str):
        return level
    raise TypeError(
        f"log level must be a name, a logging level number or None, not {type(level).__name__}"
    )


def set_log_level(level) -> None:
    """Set the library's log level: "off", "error", "warn", "info" or "debug" (any case; also
    the aliases STRIDEATTN_LOG accepts), a Python logging level (logging.INFO, ...), or None
    (off). Also sets the "strideattn" logger's level to match, so the records reach its
    handlers. At "info" each distinct message (e.g. which backend runs a class of problem) is
    logged once, then as "... repeated N times: ..." at powers of two and on flush_log()."""
    name = _level_name(level)
    _ext.set_log_level(name)  # ValueError naming the accepted values for an unknown name
    _sync_logger_level(force=True)


def get_log_level() -> str:
    """The library's current log level name ("off", "error", "warn", "info" or "debug")."""
    return _ext.log_level()


def flush_log() -> None:
    """Log the pending "... repeated N times" counts now (also done at interpreter exit)."""
    _ext.flush_log()


def _sync_logger_level(force: bool) -> None:
    name = _ext.log_level()
    if name != "off" and (force or logger.level == logging.NOTSET):
        logger.setLevel(
            {
                "error": logging.ERROR,
                "warn": logging.WARNING,
                "info": logging.INFO,
                "debug": logging.DEBUG,
            }[name]
        )


def _shutdown() -> None:
    # Before the interpreter finalises: the last counts, then the library's own stderr sink.
    _ext.flush_log()
    _ext._set_log_forwarder(None)


_ext._set_log_forwarder(_forward)
_sync_logger_level(force=False)  # reads STRIDEATTN_LOG (an unknown value warns through _forward)
atexit.register(_shutdown)
