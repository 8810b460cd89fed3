"""Text sources for trace collection and draft alignment: a `datasets` dataset, JSONL, a folder, a file list.

Every source becomes an ordered list of strings, so collection work units (text index, position)
are deterministic and a resumed run redoes exactly the same work.
"""

from __future__ import annotations

import json
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".py", ".md", ".rst", ".json", ".jsonl", ".c", ".h", ".js", ".ts", ".html", ".csv")


def load_texts(
    source: str | Path | None = None,
    column: str = "text",
    split: str = "train",
    file_list: str | Path | None = None,
    limit: int | None = None,
) -> list[str]:
    """Load texts from `source` (dataset name/path, .jsonl/.json file, folder, text file) or `file_list`.

    `file_list` is a text file with one path per line (e.g. the demo pair's held-out files).
    Raises ValueError naming the argument when the column is missing or nothing usable is found.
    """
    if (source is None) == (file_list is None):
        raise ValueError("Pass exactly one of source= (dataset, .jsonl, folder or text file) and file_list=.")
    if file_list is not None:
        listed = Path(file_list)
        if not listed.is_file():
            raise ValueError(f"file_list={str(file_list)!r} does not exist; pass a text file with one path per line.")
        paths = [Path(line.strip()) for line in listed.read_text().splitlines() if line.strip()]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise ValueError(f"file_list={str(file_list)!r} names {len(missing)} missing files, e.g. {missing[:3]}.")
        texts = [p.read_text(errors="replace") for p in paths]
        where = f"file_list={str(file_list)!r}"
    else:
        texts, where = _from_source(str(source), column, split), f"source={str(source)!r}"
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if limit is not None:
        texts = texts[:limit]
    if not texts:
        raise ValueError(f"{where} holds no non-empty texts; check the path, the split and the column.")
    return texts


def _from_source(source: str, column: str, split: str) -> list[str]:
    path = Path(source)
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        import datasets

        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise ValueError(f"source={source!r} has splits {list(data)}, not split={split!r}; pass --split.")
            data = data[split]
        return _column(data, column, source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise ValueError(f"source={source!r} is a folder without text files ({', '.join(TEXT_SUFFIXES)}).")
        return [f.read_text(errors="replace") for f in files]
    if path.is_file() and path.suffix in (".jsonl", ".json"):
        rows = []
        with path.open() as handle:
            if path.suffix == ".json" and handle.read(1) == "[":
                handle.seek(0)
                rows = json.load(handle)
            else:
                handle.seek(0)
                rows = [json.loads(line) for line in handle if line.strip()]
        if rows and column not in rows[0]:
            raise ValueError(f"source={source!r} rows have keys {sorted(rows[0])}, not column={column!r}; "
                             "pass --column <key>.")
        return [row.get(column) for row in rows]
    if path.is_file():
        return [path.read_text(errors="replace")]
    import datasets  # a Hub dataset name (needs network access)

    return _column(datasets.load_dataset(source, split=split), column, source)


def _column(data, column: str, source: str) -> list[str]:
    if column not in data.column_names:
        raise ValueError(f"source={source!r} has columns {data.column_names}, not column={column!r}; "
                         "pass --column <name>.")
    return list(data[column])
