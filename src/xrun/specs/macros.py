"""The placeholders a scheduler fills in per replica (``${app_id}``, ``${replica_id}``, ...)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xrun.specs.api import Role


# --------------------------------------------------------------------------- macros
class macros:  # noqa: N801 - a namespace, named like TorchX's for familiarity
    """Placeholders a scheduler fills in per replica, in ``args`` and ``env`` values.

    ``${app_id}``, ``${replica_id}``, ``${img_root}``, ``${rank0_env}`` (the *name* of an env var
    whose value is the first replica's host). Unknown ``${x}`` are left alone; ``$$`` is ``$``.
    """

    app_id = "${app_id}"
    replica_id = "${replica_id}"
    img_root = "${img_root}"
    rank0_env = "${rank0_env}"

    _PATTERN = re.compile(r"\$\$|\$\{(app_id|replica_id|img_root|rank0_env)\}")

    @dataclass
    class Values:
        img_root: str
        app_id: str
        replica_id: str
        rank0_env: str

        def substitute(self, text: str) -> str:
            if "$" not in text:
                return text
            # The fields as they are: asdict() deep-copies them, once per substituted string,
            # which was half the time of a 16,384-replica dry run.
            values = vars(self)

            def repl(m: re.Match[str]) -> str:
                return "$" if m.group(0) == "$$" else str(values[m.group(1)])

            return macros._PATTERN.sub(repl, text)

        def fill(self, role: Role) -> tuple[list[str], dict[str, str]]:
            """``role``'s args and env with every macro substituted (new list and dict; the role
            is not copied: a scheduler that needs only these skips a deep copy per replica)."""
            return (
                [self.substitute(a) for a in role.args],
                {k: self.substitute(v) for k, v in role.env.items()},
            )

        def apply(self, role: Role) -> Role:
            """A copy of ``role`` with every macro substituted; ``role`` itself is untouched."""
            out = copy.deepcopy(role)
            out.args, out.env = self.fill(out)
            return out
