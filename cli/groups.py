"""Option groups: a frozen dataclass of options that a command takes as one parameter.

A group (cli.options.ModelOptions, TrainOptions, ...) declares its fields once, each typed with an
Annotated typer option, and takes their defaults from its DEFAULTS (most often the values of the
config dataclass it fills). `with_groups` rewrites a command's signature so typer sees each field
of a group as its own flag (in the group parameter's place, so `--help` lists them where the
parameter stands), and at call time packs the parsed values back into one instance of the group.
A command that needs other defaults or fewer flags says so with `Group.with_defaults` /
`Group.optional` / `Group.without`, never by listing fields.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY


class OptionGroup:
    """Base of the option groups (frozen dataclasses); the class methods start a per-command variant.

    A group's fields have no defaults of their own: DEFAULTS maps a field to its default (most often
    the config dataclass the group fills, so a default is never repeated as a literal); a field not
    in DEFAULTS defaults to None (not given).
    """

    DEFAULTS: ClassVar[Mapping[str, Any]] = {}
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # set by each subclass's @dataclass

    @classmethod
    def with_defaults(cls, **defaults: Any) -> Group:
        return Group(cls).with_defaults(**defaults)

    @classmethod
    def optional(cls) -> Group:
        return Group(cls).optional()

    @classmethod
    def without(cls, *names: str) -> Group:
        return Group(cls).without(*names)

    def given(self) -> dict[str, Any]:
        """The fields not None (None = not given, where a command defaults the group to None)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Group:
    """One command's view of an OptionGroup: its own defaults, and fields it does not offer as flags.

    A field left out keeps its (overridden) default in the instance the command receives.
    """

    cls: type[OptionGroup]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    omit: frozenset[str] = frozenset()

    def _names(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self.cls)]

    def with_defaults(self, **defaults: Any) -> Group:
        unknown = set(defaults) - set(self._names())
        if unknown:
            raise TypeError(f"{self.cls.__name__} has no option {sorted(unknown)}")
        return dataclasses.replace(self, defaults={**self.defaults, **defaults})

    def optional(self) -> Group:
        """Every field defaults to None (= the config the command starts from, e.g. the swarm's)."""
        return self.with_defaults(**dict.fromkeys(self._names()))

    def without(self, *names: str) -> Group:
        unknown = set(names) - set(self._names())
        if unknown:
            raise TypeError(f"{self.cls.__name__} has no option {sorted(unknown)}")
        return dataclasses.replace(self, omit=self.omit | set(names))

    def _default(self, f: dataclasses.Field) -> Any:
        return self.defaults[f.name] if f.name in self.defaults else self.cls.DEFAULTS.get(f.name)

    def parameters(self) -> list[inspect.Parameter]:
        """The group's flags as keyword parameters, annotated with their typer options."""
        hints = typing.get_type_hints(self.cls, include_extras=True)
        return [
            inspect.Parameter(f.name, KEYWORD_ONLY, default=self._default(f), annotation=hints[f.name])
            for f in dataclasses.fields(self.cls)
            if f.name not in self.omit
        ]

    def pack(self, kwargs: dict[str, Any]) -> OptionGroup:
        """The group instance from the parsed values (popped from kwargs) and the left-out defaults."""
        fields = dataclasses.fields(self.cls)
        return self.cls(**{f.name: self._default(f) if f.name in self.omit else kwargs.pop(f.name) for f in fields})


def with_groups(**groups: type[OptionGroup] | Group) -> Callable[[F], F]:
    """Expand each parameter named in `groups` into the group's flags; pass the packed group instead.

    `@with_groups(model=ModelOptions)` on `def cmd(..., model: ModelOptions, ...)`: typer sees
    --blocks, --d-model, ... where `model` stands; `cmd` receives `model=ModelOptions(...)`.
    """
    specs = {name: g if isinstance(g, Group) else Group(g) for name, g in groups.items()}

    def decorate(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        missing = set(specs) - set(signature.parameters)
        if missing:
            raise TypeError(f"{func.__name__} has no parameter {sorted(missing)} to expand")
        params: list[inspect.Parameter] = []
        for p in signature.parameters.values():
            expanded = specs[p.name].parameters() if p.name in specs else [p]
            params.extend(q.replace(kind=KEYWORD_ONLY) for q in expanded)

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            for name, spec in specs.items():
                kwargs[name] = spec.pack(kwargs)
            return func(**kwargs)

        command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
        return typing.cast(F, command)

    return decorate
