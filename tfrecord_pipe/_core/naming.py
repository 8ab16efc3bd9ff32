"""The names of a dataset folder's files and splits: the one place that knows them.

    OUT/train-00000-of-00016.tfrecord      shards of split "train" (".tfrecord.gz": GZIP)
    OUT/train-00000-of-00016.array_record  the same records as ArrayRecord (`--formats`)
    OUT/validation-00000-of-00002.tfrecord
    OUT/rejected/rejected-train.jsonl      every input of the split that was not used, and why
    OUT/labels.txt, OUT/manifest.json      written last: a manifest means a complete dataset

The converter names files with these functions; the reader, `inspect`, `verify` and `bench`
parse names with them.
"""

from __future__ import annotations

import functools
import re
import unicodedata

from tfrecord_pipe._core import paths

MANIFEST_NAME = "manifest.json"
TEMP_PREFIX = ".tmp-"  # OUT/.tmp-<run>: where a conversion writes before it finishes
CLAIM_NAME = ".tfrecord-pipe-claim"  # OUT/.tfrecord-pipe-claim: a conversion is writing OUT
LABELS_NAME = "labels.txt"
REJECTED_DIR = "rejected"
DUPLICATES_NAME = "duplicates.jsonl"  # inputs with the same bytes, one group per line

TRAIN, VALIDATION, TEST = "train", "validation", "test"
SPLIT_ORDER = (TRAIN, VALIDATION, TEST)  # others after these, by name
# Folder names that say split rather than label (Kaggle's test1, ImageNet's val, ...).
SPLIT_LIKE = frozenset({*SPLIT_ORDER, "val", "valid", "test1", "dev", "eval"})
VALIDATION_LIKE = frozenset({"val", "valid", "dev", "eval"})  # other names for validation

# The shard file formats the job writes, by the suffix their files take (TFDS's names for them).
TFRECORD, ARRAY_RECORD = "tfrecord", "array_record"
FILE_FORMATS = (TFRECORD, ARRAY_RECORD)

GZIP = "GZIP"
COMPRESSIONS = ("", GZIP)  # as tf.data.TFRecordDataset's compression_type takes them

_SPLIT_NAME = re.compile(r"[A-Za-z0-9_-]+")
# Our names, and the Cloud TPU scripts' (train-00000-of-01024, without a suffix).
_SHARD_TAIL = r"-\d{5,}-of-\d{5,}((\.tfrecord)?(\.gz)?|\.array_record)"
_SHARD_NAME = re.compile(r"(?P<split>[A-Za-z0-9_-]+)" + _SHARD_TAIL)


def shard_name(split: str, index: int, shards: int, compressed: bool,
               file_format: str = TFRECORD) -> str:  # fmt: skip
    """`train-00003-of-00016.tfrecord`, with `.gz` when GZIP-compressed;
    `train-00003-of-00016.array_record` for ArrayRecord (compressed inside, never named so)."""
    if file_format == ARRAY_RECORD:
        suffix = "." + ARRAY_RECORD
    else:
        suffix = ".tfrecord.gz" if compressed else ".tfrecord"
    return f"{split}-{index:05d}-of-{shards:05d}{suffix}"


def split_of(name: str) -> str | None:
    """The split a shard file's name (or path) gives; None for a name not made by `shard_name`."""
    found = _SHARD_NAME.fullmatch(paths.basename(name))
    return found.group("split") if found else None


def no_such_split(dataset: str, split: str, splits) -> str:
    """What to say when a reader asks `dataset` for a split it does not have (Imagenette's
    and ImageNet's validation split is `val`, the folder's name)."""
    said = f"{dataset} has no split {split!r}; it has {sorted(splits)}: pass split= one of those."
    if split == VALIDATION and not VALIDATION_LIKE & set(splits):
        # Evaluation's default, where only train was converted (most often)
        said += (" Or, to evaluate on images held out of training, convert again with "
                 "--validation_fraction (0.1 holds out a tenth), or with split folders a "
                 "validation folder beside train.")  # fmt: skip
    return said


def manifest_split_problem(split: str, files) -> str | None:
    """Why a manifest cannot list `files` for `split`, or None. Readers join the names to the
    dataset's folder, `--overwrite` deletes them and the split names its rejection file: only
    names `shard_name` makes for that split will do, never a path (`../notes.txt`,
    `/home/...`). (Split names of 0.1's first days, `val 2017`, still pass.)"""
    if not isinstance(split, str) or not split or any(c in split for c in "/\\\0"):
        return f"split {split!r} cannot name files"
    pattern = re.compile(re.escape(split) + _SHARD_TAIL)
    for name in files:
        if not isinstance(name, str) or not pattern.fullmatch(name):
            return (f"split {split}'s files list {name!r}, which is not a shard file name of "
                    f"that split (such as {shard_name(split, 0, 1, False)})")  # fmt: skip
    return None


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")


def is_image_name(name: str) -> bool:
    """Whether a file's name is an image's: for what is given in the wrong place (images as
    OUTPUT, or to a reader); what the converter reads it judges by the bytes."""
    return name.lower().endswith(_IMAGE_SUFFIXES)


def file_format_of(name: str) -> str:
    """The file format a shard's name says: ARRAY_RECORD for `.array_record`, else TFRECORD."""
    return ARRAY_RECORD if str(name).endswith("." + ARRAY_RECORD) else TFRECORD


def formats_problem(formats) -> str | None:
    """Why `formats` cannot be the formats a job writes, or None."""
    unknown = [f for f in formats if f not in FILE_FORMATS]
    if unknown or not formats:
        return f"formats must be one or more of {FILE_FORMATS}, got {list(formats)}"
    if len(set(formats)) != len(formats):
        return f"formats lists a format twice: {list(formats)}"
    return None


def rejected_name(split: str) -> str:
    """The rejected-inputs file of a split, relative to the dataset folder."""
    return f"{REJECTED_DIR}/rejected-{split}.jsonl"


def compression_of(files) -> str:
    """GZIP when every file name ends in .gz (as compressed shards are named), else ""."""
    return GZIP if files and all(str(path).endswith(".gz") for path in files) else ""


def split_name_problem(split: str) -> str | None:
    """Why `split` cannot be a split's name (it becomes part of file names), or None."""
    if _SPLIT_NAME.fullmatch(split):
        return None
    return (
        f"{split!r} is not a usable split name: it becomes part of file names, so use letters, "
        "digits, '_' and '-' only (e.g. train, validation)"
    )


@functools.lru_cache(maxsize=4096)  # a listing asks once an input, of a few labels
def label_problem(label: str) -> str | None:
    """Why `label` cannot be a label, or None: labels.txt holds one label a line, as written,
    so a line break would make two labels of one (shifting every label after it) and spaces at
    the ends would be lost by readers that strip lines."""
    if label.splitlines() != [label]:
        return f"label {label!r} has a line break, which would make two lines of labels.txt"
    if label != label.strip():
        return f"label {label!r} has spaces at its ends, which readers of labels.txt lose"
    if label.startswith("\ufeff"):  # (an invisible character: a helper's trial)
        return (f"label {label!r} starts with a byte-order mark, which readers of labels.txt "
                "drop from its first line")  # fmt: skip
    return None


def look_alike(names) -> str:
    """The names (labels, splits) that are different but print alike, for a message (`'Dog'
    / 'dog'; 'café' / 'café'`, escaped), or "" when none do: the same text in another case
    or Unicode form (`café` typed as one character or as e and an accent, a fullwidth `ｃ`),
    or with invisible characters or another kind of space (`_as_printed`)."""
    groups = {}
    for name in names:
        groups.setdefault(_as_printed(name), []).append(name)
    alike = [group for group in groups.values() if len(group) > 1]
    return "; ".join(" / ".join(ascii(name) for name in group) for group in alike)


def alike_to(names, known) -> list[tuple[str, str]]:
    """(name, the one of `known` it prints like) for each of `names` not in `known` that prints
    like one of them (`look_alike`'s sense): a label folder 'café' decomposed, as macOS
    writes names, beside a labels file's 'café' typed as one character."""
    printed = {_as_printed(one): one for one in known}
    return [(name, printed[_as_printed(name)]) for name in sorted(set(names) - set(known))
            if _as_printed(name) in printed]  # fmt: skip


def _as_printed(name: str) -> str:
    """`name` as a reader sees it: compatibility forms folded (fullwidth letters, ligatures),
    case ignored, invisible characters (zero-width spaces, joiners) left out, and every kind
    of space (a no-break space) a space."""
    folded = unicodedata.normalize("NFKC", name).casefold()
    kept = (" " if char.isspace() else char for char in folded
            if unicodedata.category(char) != "Cf")  # fmt: skip
    return "".join(kept)


def split_order(name: str) -> tuple[int, str]:
    """Sort key: train, validation, test, then other splits by name."""
    return (SPLIT_ORDER.index(name) if name in SPLIT_ORDER else len(SPLIT_ORDER), name)
