"""Facade methods made from the ops' declarations (``Op.api``, see ``core._api``).

For each ``Form`` this module writes the source of ``name_async`` (as
``dataclasses`` writes ``__init__``: a plain function with the real
signature, so a call costs what a hand-written method costs) and compiles it.
Its blocking twin ``name`` is the same code handing the op to the handle's
``_call`` instead of ``_submit`` (the handles wait for it on the calling
thread, without a coroutine). ``Generated`` subclasses, one per handle,
receive every method declared for their handle. ``render_stub``
writes the typed stub (``_api.pyi``) that mypy and IDEs read.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

from atomr_accel.core._api import REQUIRED, Form, Param, on_attach
from atomr_accel.core._catalogue import load_op_modules
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op, made
from atomr_accel.core._ref import GpuRef
from atomr_accel.facade._portal import Portal, twin_of, wait_here

__all__ = ["Generated", "Method", "declared_ops", "methods_for", "render_stub"]


@functools.cache
def declared_ops() -> tuple[type[Op], ...]:
    """Every op class (of every module of ``atomr_accel.core.ops``) that declares forms."""
    load_op_modules()
    found: list[type[Op]] = []
    pending: list[type[Op]] = [Op]
    seen: set[type[Op]] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:  # a class with two op bases is reached through each
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        module = sys.modules.get(cls.__module__)
        # a slotted dataclass replaces its class: only the module's own one counts
        if cls.__dict__.get("api") and getattr(module, cls.__name__, None) is cls:
            found.append(cls)
    return tuple(sorted(found, key=lambda c: (c.__module__, c.__qualname__)))


@dataclasses.dataclass(frozen=True, slots=True)
class _Arg:
    """One parameter of a generated method."""

    param: Param
    keyword_only: bool
    annotation: str


@dataclasses.dataclass(frozen=True, slots=True)
class Method:
    """A generated method: its name, its ``*_async`` function and blocking twin, and
    what the stub needs (parameters as written, the result's type, the op it runs)."""

    name: str
    run_async: Callable[..., Any]
    run: Callable[..., Any]
    signature: inspect.Signature
    returns: str
    op: type[Op]


def _annotation(hint: Any) -> str:
    """How a field's declared type reads in a facade signature."""
    optional = False
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(rest) < len(typing.get_args(hint))
        if len(rest) > 1:  # e.g. ``int | tuple[int, ...]``: each as it reads
            each = " | ".join(_annotation(a) for a in rest)
            return f"{each} | None" if optional else each
        hint = rest[0]
    text: str
    if hint is GpuRef:
        text = "BufferLike"
    elif _is_buffers(hint):
        text = "Sequence[BufferLike]"
    elif hint in (int, float, complex, bool, str):
        text = hint.__name__
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        text = f"{hint.__name__} | str"
    elif typing.get_origin(hint) is tuple and typing.get_args(hint)[:1] == (int,):
        text = "Sequence[int]"
    elif typing.get_origin(hint) is tuple and typing.get_args(hint)[:1] == (float,):
        text = "Sequence[float]"
    elif isinstance(hint, type):
        text = hint.__name__
    else:
        text = "Any"
    return f"{text} | None" if optional else text


def _is_buffer(hint: Any) -> bool:
    return hint is GpuRef or (typing.get_origin(hint) in (types.UnionType, typing.Union)
                              and GpuRef in typing.get_args(hint))


def _is_buffers(hint: Any) -> bool:
    """Whether a field holds a tuple of buffers (``tuple[GpuRef, ...]``)."""
    return typing.get_origin(hint) is tuple and typing.get_args(hint)[:1] == (GpuRef,)


def _is_sequence(hint: Any) -> bool:
    """Whether a field takes a tuple (alone or in a union): a list given for it is made one."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return any(typing.get_origin(a) is tuple for a in typing.get_args(hint))
    return typing.get_origin(hint) is tuple


def _args(op: type[Op], form: Form, hints: dict[str, Any]) -> list[_Arg]:
    """The method's parameters: the form's, then every other field as a keyword option."""
    fields = {f.name: f for f in dataclasses.fields(op)}  # type: ignore[arg-type]
    args: list[_Arg] = []
    covered = set(form.fixed)
    for entry in form.params:
        param = entry if isinstance(entry, Param) else Param(entry)
        if not isinstance(entry, Param):
            default = fields[entry].default
            param = Param(entry, REQUIRED if default is dataclasses.MISSING else default)
        missing = [name for name in param.fields if name not in fields]
        if missing:
            raise TypeError(f"{op.__name__}.api {form.name!r}: no field {missing[0]!r}")
        covered.update(param.fields)
        annotation = param.annotation or _annotation(hints[param.fields[0]])
        args.append(_Arg(param, False, annotation))
    for name, field in fields.items():
        if name in covered:
            continue
        if field.default is dataclasses.MISSING:
            raise TypeError(f"{op.__name__}.api {form.name!r} leaves field {name!r} unset")
        args.append(_Arg(Param(name, field.default), True, _annotation(hints[name])))
    return args


def _calling(run_async: Callable[..., Any], name: str) -> Callable[..., Any]:
    """The blocking twin ``name`` of generated ``run_async``: the same code with its one
    attribute ``_submit`` read as ``_call`` (compiling a second source would double the
    methods' share of ``import atomr_accel``)."""
    code = run_async.__code__
    assert code.co_names.count("_submit") == 1, code.co_names
    twin = types.FunctionType(
        code.replace(co_names=tuple("_call" if n == "_submit" else n for n in code.co_names),
                     co_name=name, co_qualname=name),
        run_async.__globals__, name, run_async.__defaults__, run_async.__closure__)
    twin.__kwdefaults__ = run_async.__kwdefaults__
    return twin


def _source(name: str, op: type[Op], args: list[_Arg], hints: dict[str, Any],
            checked_buffer: str | None, form: Form) -> tuple[str, dict[str, Any]]:
    """The source of ``name`` and the names it uses."""
    space: dict[str, Any] = {"_op": op}
    head, body = ["self"], []
    star = False
    shared = collections.Counter(field for arg in args for field in arg.param.fields)
    parts: dict[str, list[str]] = collections.defaultdict(list)
    for i, arg in enumerate(args):
        param = arg.param
        if arg.keyword_only and not star:
            if form.timeout_last:
                head.append("timeout_secs=_timeout")
            head.append("*")
            star = True
        if param.default is REQUIRED:
            head.append(param.name)
        else:
            space[f"_d{i}"] = param.default
            head.append(f"{param.name}=_d{i}")
        names = []
        for field in param.fields:  # a sequence field other parameters set is their tuple
            if shared[field] > 1 or (field != param.name and _is_sequence(hints[field])):
                parts[field].append(f"f_{field}_{len(parts[field])}")
                names.append(parts[field][-1])
            else:
                names.append(f"f_{field}")
        targets = ", ".join(names)
        if param.parse is not None:
            space[f"_p{i}"] = param.parse
            body.append(f"{targets} = _p{i}({param.name})")
        else:
            body.append(f"{targets} = {param.name}")
    for field, names in parts.items():
        body.append(f"f_{field} = ({', '.join(names)},)")
    if not star and not form.timeout_last:
        head.append("*")
    if not star or not form.timeout_last:
        head.append("timeout_secs=_timeout")
    head.append("**unknown")
    space["_timeout"] = form.timeout
    space["_refuse"] = _refuse
    known = [a.param.name for a in args]
    body.insert(0, f"if unknown:\n        _refuse({op.__name__!r}, {name!r}, unknown, {known!r})")
    if op.in_process:
        body.insert(1, f"self._in_process_only({op.__name__!r})")
    for j, (field, value) in enumerate(form.fixed.items()):
        space[f"_x{j}"] = value
        body.append(f"f_{field} = _x{j}")
    fields = [f.name for f in dataclasses.fields(op)]  # type: ignore[arg-type]
    for field in fields:
        hint = hints[field]
        if field in form.fixed:
            continue
        if _is_buffer(hint):
            dtypes = "_dtypes" if field == checked_buffer else "None"
            convert = f"self._ref(f_{field}, {field!r}, {dtypes})"
            if hint is not GpuRef:
                convert = f"None if f_{field} is None else {convert}"
            body.append(f"f_{field} = {convert}")
        elif _is_buffers(hint):
            body.append(f"f_{field} = _refs(self, f_{field}, {field!r})")
        elif _is_sequence(hint):
            body.append(f"f_{field} = _tuple(f_{field})")
    space["_tuple"] = _as_tuple
    space["_refs"] = _refs
    for i, arg in enumerate(args):
        param = arg.param
        if param.fill is not None:
            space[f"_f{i}"] = param.fill
            uses = ", ".join(f"f_{use}" for use in param.uses)
            field = param.fields[0]
            body.append(f"if f_{field} is None:\n        f_{field} = _f{i}({uses})")
    call = ", ".join(f"f_{field}" for field in fields)  # positional: the cheapest
    space["_made"] = made  # a repeated op comes from the memo, already checked
    values = f"({call},)" if fields else "()"
    body.append(f"return self._submit(_made(_op, {values}), timeout_secs)")
    lines = "\n    ".join(body)
    return f"def {name}({', '.join(head)}):\n    {lines}\n", space


def _refuse(op: str, name: str, unknown: dict[str, Any], known: list[str]) -> None:
    """Refuse options a method does not take (``InvalidArgument`` naming those it takes)."""
    raise InvalidArgument(f"{op} takes no option {next(iter(unknown))!r}; its options are "
                          f"{', '.join(known)}, timeout_secs ({name.removesuffix('_async')}())")


def _refs(handle: Any, value: Any, name: str) -> tuple[GpuRef, ...]:
    """The ``GpuRef`` of each buffer of the sequence ``value`` (``InvalidArgument`` for
    anything else, a lone buffer included)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{name} must be a sequence of buffers, got "
                              f"{type(value).__name__}")
    return tuple(handle._ref(buffer, name, None) for buffer in value)


def _as_tuple(value: Any) -> Any:
    """A list (or other iterable but str) as a tuple; anything else as it is."""
    if isinstance(value, tuple | str | bytes) or value is None:
        return value
    try:
        return tuple(value)
    except TypeError:
        return value


def _doc(op: type[Op], form: Form, dtype: DType | None) -> str:
    text = form.doc or (op.__doc__ or "").strip().split("\n\n")[0]
    text = " ".join(text.split())
    extra = [form.note] if form.note else []
    if dtype is not None:
        extra.append(f"Takes {dtype.value} buffers; any other dtype is an ``InvalidArgument``.")
    extra.append(f"Runs ``{op.__name__}``; ``timeout_secs`` bounds the wait"
                 + ("" if form.timeout is None else f" (default {form.timeout:g} s)") + ".")
    return "\n\n".join([text, *extra])


_HINTS: dict[type[Op], dict[str, Any]] = {}


def _hints(op: type[Op]) -> dict[str, Any]:
    """The declared field types of ``op`` (read once per class)."""
    hints = _HINTS.get(op)
    if hints is None:
        hints = _HINTS[op] = typing.get_type_hints(op)
    return hints


def _method(op: type[Op], form: Form, dtype: DType | None) -> Method:
    hints = _hints(op)
    args = _args(op, form, hints)
    name = form.name if dtype is None or not form.suffixed else f"{form.name}_{dtype.value}"
    buffers = [a.param.fields[0] for a in args if _is_buffer(hints[a.param.fields[0]])]
    source, space = _source(f"{name}_async", op, args, hints,
                            buffers[0] if dtype is not None and buffers else None, form)
    if dtype is not None:
        space["_dtypes"] = (dtype,)
    exec(compile(source, f"<atomr_accel api {op.__name__}.{name}>", "exec"), space)
    run_async: Callable[..., Any] = space[f"{name}_async"]
    run_async.__qualname__ = f"{form.handle or op.library}.{name}_async"
    run_async.__module__ = __name__
    run_async.__doc__ = _doc(op, form, dtype)
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    timeout = inspect.Parameter(
        "timeout_secs", inspect.Parameter.POSITIONAL_OR_KEYWORD if form.timeout_last
        else inspect.Parameter.KEYWORD_ONLY, default=form.timeout, annotation="float | None")
    for arg in args:
        kind = (inspect.Parameter.KEYWORD_ONLY if arg.keyword_only
                else inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if arg.keyword_only and timeout.kind is not kind and timeout not in params:
            params.append(timeout)
        default = inspect.Parameter.empty if arg.param.default is REQUIRED else arg.param.default
        params.append(inspect.Parameter(arg.param.name, kind, default=default,
                                        annotation=arg.annotation))
    if timeout not in params:
        params.append(timeout)
    signature = inspect.Signature(params, return_annotation=form.returns)
    run_async.__signature__ = signature.replace(  # type: ignore[attr-defined]
        return_annotation=f"Coroutine[Any, Any, {form.returns}]")
    run = twin_of(_calling(run_async, name), run_async)
    run.__module__ = __name__
    run.__signature__ = signature  # type: ignore[attr-defined]
    return Method(name, run_async, run, signature, form.returns, op)


def methods_for(handle: str) -> Iterator[Method]:
    """Every method declared for ``handle``, in a stable order."""
    for op in declared_ops():
        for form in op.api:
            if (form.handle or op.library) != handle:
                continue
            for dtype in form.dtypes or (None,):
                yield _method(op, form, dtype)


_SETS: dict[str, list[type[Generated]]] = collections.defaultdict(list)
"""Handle -> the method sets made for it."""


def _attached(op: type, forms: tuple[Form, ...]) -> None:
    """Give the method sets made already the methods of forms attached to ``op`` later."""
    declared_ops.cache_clear()
    declared = typing.cast(type[Op], op)
    for form in forms:
        for cls in _SETS[form.handle or declared.library]:
            for dtype in form.dtypes or (None,):
                cls._add(_method(declared, form, dtype))


on_attach(_attached)


class Generated:
    """Base of the method sets: a subclass made with ``handle="blas"`` receives every
    method declared for that handle (``name_async`` and ``name``). The class that uses a
    set provides ``_ref(buffer, name, dtypes)`` (a buffer's ``GpuRef``, checked) and
    ``_submit(op, timeout_secs)`` (the awaitable of the op's result, the op checked first),
    and may provide ``_call(op, timeout_secs)`` (the result, waited for on the calling
    thread); one whose handle runs ``Op.in_process`` ops provides
    ``_in_process_only(op_name)`` (raises where they cannot run). It must come before the
    set in its bases."""

    handle: ClassVar[str] = ""
    _portal: Portal
    _submit: Callable[[Op, float | None], Any]

    def _call(self, op: Op, timeout_secs: float | None) -> Any:
        """Run ``op`` through ``_submit`` and wait for it on this thread (blocking twins)."""
        return wait_here(self._portal, self._submit(op, timeout_secs))

    def __init_subclass__(cls, handle: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.handle = handle
        if handle:
            _SETS[handle].append(cls)
        for method in methods_for(handle):
            cls._add(method)

    @classmethod
    def _add(cls, method: Method) -> None:
        """Set ``method`` (``name_async`` and ``name``); ``TypeError`` if either is set."""
        for attr in (f"{method.name}_async", method.name):
            if attr in cls.__dict__:
                raise TypeError(f"{cls.__name__}.{attr} is declared twice")
        setattr(cls, f"{method.name}_async", method.run_async)
        setattr(cls, method.name, method.run)


# ------------------------------------------------------------------------- the stub


def _stub_params(signature: inspect.Signature) -> str:
    out, star = [], False
    for p in signature.parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        text = p.name if p.name == "self" else f"{p.name}: {p.annotation}"
        if p.default is not inspect.Parameter.empty:
            text += " = ..."
        out.append(text)
    return ", ".join(out)


def render_stub(classes: list[type[Generated]], header: str,
                extra: Mapping[str, list[str]] | None = None) -> str:
    """The typed stub of ``classes`` (each a ``Generated`` subclass), after ``header``;
    ``extra`` adds lines to the class of that name."""
    lines = [header.rstrip(), ""]
    for cls in classes:
        lines += ["", f"class {cls.__name__}(Generated):"]
        lines.append(f'    """The methods declared for the ``{cls.handle}`` handle."""')
        lines += (extra or {}).get(cls.__name__, [])
        for method in methods_for(cls.handle):
            params = _stub_params(method.signature)
            lines.append(f"    def {method.name}_async({params}) -> "
                         f"Coroutine[Any, Any, {method.returns}]: ...")
            lines.append(f"    def {method.name}({params}) -> {method.returns}: ...")
        lines.append("    def _submit(self, op: Op, timeout_secs: float | None) -> Any: ...")
        lines.append("    def _call(self, op: Op, timeout_secs: float | None) -> Any: ...")
    return "\n".join(lines) + "\n"
