"""``prune``: the journal cut down to the studies behind a table's entries. Every re-tune after a
source change starts new studies (their names carry the source hash) and the old ones stay in
the journal; the shipped tables never read them, the report reads caches, not studies."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pycuda_heads import records

from .locks import JournalLock
from .storage import open_storage


def study_names(table: Mapping[str, Any]) -> set[str]:
    """The names of the studies behind ``table``'s entries (as ``Task.study_name`` makes
    them)."""
    slug = table["slug"]
    return {f"{slug}:{e['kernel']}:{records.dims_label(e['template'])}:"
            f"{records.dims_label(e['shape'])}" + (f":{e['source_hash']}"
                                                   if e.get("source_hash") else "")
            for e in table["entries"]}


def prune_journal(journal: Path, keep: set[str]) -> tuple[int, int]:
    """Rewrite ``journal`` with only the studies named in ``keep``, their trials as they were;
    (studies kept, studies dropped). A writer appending meanwhile makes it refuse, leaving the
    journal untouched."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not journal.is_file():
        raise FileNotFoundError(f"no journal at {journal}")
    size = journal.stat().st_size
    source = open_storage(str(journal), journal.parent)
    names = [s.study_name for s in source.get_all_studies()]
    kept = [n for n in names if n in keep]
    tmp = journal.with_name(journal.name + ".pruned.tmp")
    tmp.unlink(missing_ok=True)
    target = JournalStorage(JournalFileBackend(str(tmp)))
    for name in kept:
        optuna.copy_study(from_study_name=name, from_storage=source, to_storage=target)
    lock = JournalLock(journal)
    lock.acquire()
    try:
        if journal.stat().st_size != size:
            tmp.unlink()
            raise RuntimeError(f"{journal} grew while it was pruned (a tuner is writing to it); "
                               "run prune again once it has stopped")
        os.replace(tmp, journal)
    finally:
        lock.release()
    return len(kept), len(names) - len(kept)
