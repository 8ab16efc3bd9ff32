"""One line of a dataset's `rejected/rejected-<split>.jsonl`: an input that was not used, and
why, in words a user can act on."""

from __future__ import annotations

import dataclasses
import json


@dataclasses.dataclass(frozen=True)
class Rejection:
    """Attributes:
    path: where the input was read (as listed).
    relpath: its path relative to the input root (the record's name, had it been stored).
    split: the split it was listed in.
    reason: the reason code (`images.py`'s constants: truncated, unreadable, duplicate, ...).
    error: what was wrong, for a person.
    """

    path: str
    relpath: str
    split: str
    reason: str
    error: str = ""

    def to_json(self) -> str:
        """The line's JSON (keys sorted: re-runs write the same bytes)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Rejection:
        """Raises ValueError: not a rejection (no JSON object with a path, a split and a
        reason, all strings)."""
        try:
            data = json.loads(line)
        except RecursionError as err:  # brackets nested past Python's limit
            raise ValueError("nested too deeply to be a rejection") from err
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        data.setdefault("relpath", data.get("path"))
        fields = {field.name for field in dataclasses.fields(cls)}
        known = {key: value for key, value in data.items() if key in fields}
        missing = [name for name in ("path", "split", "reason") if not isinstance(known.get(name), str)]
        if missing or not all(isinstance(value, str) for value in known.values()):
            raise ValueError(f"no text {', '.join(missing) or 'in every field'}")
        return cls(**known)
