"""Deprecation helpers for the filter classes' constructor conventions (see docs/conventions.md).

Every filter class takes ``(model, likelihood)`` positionally and all hyper-parameters by
keyword. Classes that took hyper-parameters positionally in 0.1 accept the old calls for
one more release through :func:`positional_deprecated`, with a DeprecationWarning.
"""

import functools
import os
import sys
import warnings

import numpy as np

__all__ = ["positional_deprecated", "keyword_renamed", "renamed_keyword", "deprecated_stored_rng", "check_call_rng"]


_FILTERS_DIR = os.path.dirname(os.path.abspath(__file__))


def user_stacklevel():
    """The ``stacklevel`` for a warning raised by the caller of this function that points at the
    first frame outside refbayes.filters (the user's call), however many wrappers lie between."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_FILTERS_DIR):
        frame, level = frame.f_back, level + 1
    return level


def positional_deprecated(*names):
    """Decorate ``__init__(self, model, likelihood, *, ...)`` so that extra positional arguments
    fill the keywords ``names`` in order, with a DeprecationWarning (the 0.1 call style).

    ``inspect.signature`` still reports the keyword-only signature of the wrapped function.
    """

    def wrap(init):
        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            if len(args) > 2:
                extra = args[2:]
                if len(extra) > len(names):
                    raise TypeError(f"{type(self).__name__}() takes model and likelihood positionally and "
                                    f"hyper-parameters by keyword; got {len(args)} positional arguments")
                spelled = ", ".join(f"{n}=" for n in names[:len(extra)])
                warnings.warn(f"{type(self).__name__}: passing {spelled.replace('=', '')} positionally is deprecated "
                              f"and will be removed in the next release; pass them by keyword ({spelled}...)",
                              DeprecationWarning, stacklevel=user_stacklevel())
                for name, value in zip(names, extra):
                    if name in kwargs:
                        raise TypeError(f"{type(self).__name__}() got multiple values for argument {name!r}")
                    kwargs[name] = value
                args = args[:2]
            return init(self, *args, **kwargs)

        return __init__

    return wrap


def renamed_keyword(kwargs, old, new, cls, convert=None):
    """Move a deprecated keyword ``old`` in ``kwargs`` to ``new`` (DeprecationWarning); returns kwargs.

    ``convert`` maps the old value to the new one where the meaning of the values changed too.
    """
    if old in kwargs:
        if new in kwargs:
            raise TypeError(f"{cls}: pass {new}= only ({old}= is its deprecated spelling)")
        value = kwargs.pop(old)
        warnings.warn(f"{cls}: {old}= is deprecated and will be removed in the next release; use {new}=",
                      DeprecationWarning, stacklevel=user_stacklevel())
        kwargs[new] = convert(value) if convert is not None else value
    return kwargs


def keyword_renamed(old, new, convert=None, check=None):
    """Decorate ``__init__`` so that the deprecated keyword ``old`` is accepted as ``new``
    (DeprecationWarning); ``check(value)`` validates the old value, ``convert`` maps it."""

    def wrap(init):
        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            if old in kwargs and check is not None:
                check(kwargs[old])
            renamed_keyword(kwargs, old, new, type(self).__name__, convert)
            return init(self, *args, **kwargs)

        return __init__

    return wrap


def deprecated_stored_rng(rng, cls):
    """Check a constructor ``rng`` (the 0.1 style: a Generator kept on the filter and advanced by
    every call). Returns it; warns with DeprecationWarning when it is not None."""
    if rng is None:
        return None
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or None; got {type(rng).__name__}")
    warnings.warn(f"{cls}(rng=...) is deprecated and will be removed in the next release: a stored generator is "
                  "advanced by every call, hidden state shared between calls; pass rng= to update, "
                  "predict_update or scan instead", DeprecationWarning, stacklevel=user_stacklevel())
    return rng


def check_call_rng(rng):
    """A per-call ``rng``: a numpy.random.Generator or None; TypeError otherwise."""
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or None; got {type(rng).__name__}")
    return rng

