"""A family's options: the choices a family offers beyond the `Target` (how its own parts run), as
values its module declares, checked once at load and handed to its model's constructor.

    Option(name, choices, help, needs)   one option: the constructor's keyword, its choices (the
                                         first is the default), a sentence for `--help`, and what a
                                         model must have to take it, in words (for the refusal)

A model class lists its own in `OPTIONS` (models/base.py: none); `minillm.load(..., options={...})`
checks them against the family's row (checkpoints/families.py) and builds the model with them; the
CLI derives one flag per option from the rows (cli/common.py). A model is never changed after load:
`model.with_options(name=value)` is another model sharing its weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


class OptionError(ConfigError):
    """An option no family has, one this model's family does not take, or a value outside its choices."""


@dataclass(frozen=True)
class Option:
    name: str                    # the constructor's keyword, e.g. "mla_decode"
    choices: tuple[str, ...]     # the first is the default
    help: str                    # for --help: what it changes, each choice in words
    needs: str                   # what a model must have to take it, e.g. "latent attention (...)"

    @property
    def default(self) -> str:
        return self.choices[0]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value) -> str:
        if value not in self.choices:
            raise OptionError(f"{self.flag} {value!r}: choose {' or '.join(self.choices)}")
        return value


def check_options(declared, options: dict | None, who: str, known=()) -> dict:
    """`options` (name -> value) checked against the options a model declares (`declared`): each one
    its own, each value one of its choices; one line otherwise. known: every family's options, so
    that one this model lacks is named with what it needs. -> the options as a new dict."""
    options = dict(options or {})
    mine = {o.name: o for o in declared}
    for name, value in options.items():
        o = mine.get(name)
        if o is None:
            other = next((k for k in known if k.name == name), None)
            if other is None:
                names = ", ".join(k.name for k in known) or "none"
                raise OptionError(f"option {name!r}: no family takes it (options: {names})")
            raise OptionError(f"{other.flag}: {who} has no {other.needs}")
        o.check(value)
    return options
