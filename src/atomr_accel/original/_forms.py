"""Tell the original package's ``spawn`` form from a blueprint's own form."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["attach_spawn", "is_models", "own_form"]


def own_form(original: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
             model: str, is_model: Callable[[Any], bool] = callable) -> bool:
    """Whether a ``spawn(system, *args, **kwargs)`` call takes the blueprint's own form.

    It does when it passes the model first after the system (positionally,
    where ``is_model`` tells it from the original package's argument in that
    place, or by its keyword ``model``), or when its arguments do not fit
    ``original``, the original package's ``spawn(cls, system, ...)``; the own
    form then says what is wrong with them. Otherwise the call is the
    original package's form.
    """
    if model in kwargs or (len(args) > 0 and is_model(args[0])):
        return True
    try:
        inspect.signature(original).bind(None, None, *args, **kwargs)
    except TypeError:
        return True
    return False


def is_models(value: object) -> bool:
    """True for a collection of models (stages, replicas), not the original's name or count."""
    return value is not None and not isinstance(value, str | int)


def attach_spawn(cls: type, original: Callable[..., Any], model: str,
                 is_model: Callable[[Any], bool] = callable) -> None:
    """Give the blueprint ``cls``'s ``spawn`` the original package's form as well.

    ``original(spawn, system, ...)`` is that form: it gets the blueprint's own
    ``spawn`` (bound to the class) to start the blueprint with. The new
    ``spawn`` takes the own form where ``own_form`` says so (``model`` names
    the own form's model argument, ``is_model`` tells it apart), the
    original's otherwise; its docstring is the own form's and the original's.
    """
    own = cls.__dict__["spawn"].__func__

    @functools.wraps(own)
    def spawn(klass: type, system: Any, *args: Any, **kwargs: Any) -> Any:
        if own_form(original, args, kwargs, model, is_model):
            return own(klass, system, *args, **kwargs)
        return original(functools.partial(own, klass), system, *args, **kwargs)

    params = list(inspect.signature(original).parameters.values())[1:]
    form = ", ".join(str(p) for p in params).replace(": SystemLike", "")
    spawn.__doc__ = (f"{inspect.cleandoc(own.__doc__ or '')}\n\nThe original package's form, "
                     f"``spawn({form})``: {inspect.cleandoc(original.__doc__ or '')}")
    cls.spawn = classmethod(spawn)  # type: ignore[attr-defined]
