"""A training run's output folder, read: what it holds and what it says of the run that wrote it.  Every
question about an existing run (is there a checkpoint, which is newest, what settings, corpus and command it
was started with, whether it saved its tokenizer) is answered here, for every command alike."""

from __future__ import annotations

import os
from typing import Any

from .. import checkpoint as ckpt
from ..errors import UserError
from ..files import read_json_object

SETTINGS_FILES = {"pretrain": "pretrain_config.json", "finetune": "finetune_config.json"}
TASK = "task_name"  # (a fine-tuning run's record: which task trained it)
CORPUS = "corpus"  # beside the settings: what the run trains on, by content (a digest)
COMMAND = "command"  # and the command line that started it (its model card's, when it is resumed)


class RunFolder:
    """The output folder ``out`` of a run of ``kind`` (pretrain, finetune)."""

    def __init__(self, out: str, kind: str):
        self.out, self.kind = out, kind
        self.settings_file = os.path.join(out, SETTINGS_FILES[kind]) if out else ""

    def checkpoints(self) -> list[tuple[int, str]]:
        """(step, folder) of each whole checkpoint, oldest first."""
        return ckpt.list_checkpoints(self.out) if self.out else []

    def newest_step(self) -> int | None:
        found = self.checkpoints()
        return found[-1][0] if found else None

    @property
    def started(self) -> bool:
        """Whether a run started here and saved its settings (it can start again, or go on)."""
        return bool(self.settings_file) and os.path.isfile(self.settings_file)

    @property
    def finished(self) -> bool:
        """Whether the run wrote its end files (its final metrics)."""
        return bool(self.out) and os.path.isfile(os.path.join(self.out, "metrics.json"))

    @property
    def has_tokenizer(self) -> bool:
        return bool(self.out) and os.path.isfile(os.path.join(self.out, "tokenizer.json"))

    def saved(self) -> dict[str, Any] | None:
        """Everything the run saved with its settings (None when nothing was saved)."""
        return read_json_object(self.settings_file, os.path.basename(self.settings_file)) if self.started else None

    def settings(self) -> dict[str, Any] | None:
        """The run's settings alone, without what is recorded beside them."""
        saved = self.saved()
        return None if saved is None else {k: v for k, v in saved.items() if k not in (CORPUS, COMMAND)}

    def corpus(self) -> dict | None:
        """What the run trains on, by content (None when not recorded)."""
        found = self._field(CORPUS)
        return found if isinstance(found, dict) else None

    def command(self) -> list[str] | None:
        """The command line that started the run (None when not recorded)."""
        found = self._field(COMMAND)
        return found if isinstance(found, list) and all(isinstance(a, str) for a in found) else None

    def _field(self, name: str) -> Any:
        try:
            saved = self.saved()
        except UserError:
            return None
        return saved.get(name) if saved is not None else None
