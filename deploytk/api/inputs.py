"""What the Python API's ``model`` argument may be, turned into one validated ``DeployConfig``.

A model object (copied and held for this process, see ``deploytk.exporter.source``), a timm name, an ``hf:`` name or
folder, a YAML config path, a ready-made config's name (``deit_small_tome_r16``) or a ``DeployConfig``; keyword
arguments override the config's fields, and a bad one is refused naming the keyword, not the config field it lands in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeAlias

from torch import nn

from deploytk.config import DeployConfig, absolute_hf_folder, config_from_dict, load_config, parse_r_option
from deploytk.errors import DeploytkError
from deploytk.exporter.source import HeldObject, take
from deploytk.ready_made import find as find_ready_made
from deploytk.reducers import METHODS

#: what ``model`` may be
ModelLike: TypeAlias = nn.Module | str | Path | DeployConfig
#: the config field each keyword lands in (``merge.options.<name>``: every other keyword, a method option)
FIELDS = {
    "method": ("merge", "method"),
    "r": ("merge", "r"),
    "prop_attn": ("merge", "prop_attn"),
    "img_size": ("export", "img_size"),
    "precision": ("export", "precision"),
    "output_kind": ("export", "output"),
    "feature_layer": ("export", "feature_layer"),
    "batch_size": ("export", "batch_size"),
    "checkpoint": (None, "checkpoint"),
}
CONFIG_SUFFIXES = (".yaml", ".yml")


def r_value(r: Any) -> Any:
    """``r`` as the config takes it: an int, one int per block, ``(r, inflection)``, or the CLI's text ('16', '8,8,4',
    '16:-1')."""
    if isinstance(r, tuple) and len(r) == 2:
        return {"r": r[0], "inflection": r[1]}
    if isinstance(r, str):
        return parse_r_option(r)
    return r


def _in_keywords(message: str, where: str) -> str:
    """A config error's text, with the config fields the keywords set named as those keywords."""
    message = message.replace(f"invalid config {where}:", f"invalid arguments to {where}:")
    for keyword, (section, field) in FIELDS.items():
        message = message.replace(f"`{section + '.' if section else ''}{field}`", f"`{keyword}`")
    message = re.sub(r"`merge\.options\.([A-Za-z_]+)`", r"`\1`", message)
    return re.sub(r"`([a-z_][a-z0-9_]*)` = ([^:;]+?):", r"`\1=\2`:", message)  # `keep_rate` = 3.0: -> `keep_rate=3.0`:


def resolve(model: ModelLike, where: str, store: bool = False, **keywords: Any) -> tuple[DeployConfig, HeldObject | None]:
    """(the config ``model`` and ``keywords`` make, the held object when ``model`` is one). ``where`` names the call in
    errors (``deploytk.export()``); a keyword left None keeps the config's value (the default for a name or object);
    ``options`` is a dict of method options, merged with the other unknown keywords; ``store``: an object's weights and
    architecture are stored for another process (export), in a temporary folder the caller closes (``HeldObject.close``);
    without ``store`` nothing is written, so there is nothing to close."""
    options = dict(keywords.pop("options", None) or {})
    options.update({k: keywords.pop(k) for k in list(keywords) if k not in FIELDS})
    held = None
    if isinstance(model, DeployConfig):
        data = model.model_dump(exclude_unset=True)
    elif isinstance(model, (str, Path)) and (Path(model).suffix in CONFIG_SUFFIXES or Path(model).is_file() or find_ready_made(model)):
        data = load_config(model).model_dump(exclude_unset=True)
    elif isinstance(model, (str, Path)):
        data = {"model": absolute_hf_folder(str(model))}
    else:
        held = take(model, store)
        data = {"model": held.name, "export": {"img_size": list(held.img_size)}}
        wanted = keywords.get("img_size")
        if wanted is not None and tuple(wanted if isinstance(wanted, (list, tuple)) else (wanted, wanted)) != held.img_size:
            raise DeploytkError(
                f"`img_size={wanted!r}`, but the model object is built for {held.img_size[0]}x{held.img_size[1]}; deploytk "
                "does not resample a model object's position embedding.",
                hint="Leave `img_size` out (the model's own size), or build the model at the size you want.",
            )
    if "r" in keywords and keywords["r"] is not None:
        keywords["r"] = r_value(keywords["r"])
    if isinstance(keywords.get("img_size"), tuple):
        keywords["img_size"] = list(keywords["img_size"])
    if keywords.get("checkpoint") is not None:
        keywords["checkpoint"] = str(Path(keywords["checkpoint"]).expanduser().resolve())
    before = (data.get("merge") or {}).get("method", "tome")
    if keywords.get("method") not in (None, before):  # the config's options (and r) were another method's
        merge = data.get("merge") or {}
        merge.pop("options", None)
        if keywords.get("r") is None and keywords["method"] in METHODS and not METHODS[keywords["method"]].uses_r:
            merge.pop("r", None)
    for keyword, value in keywords.items():
        if value is not None:
            section, field = FIELDS[keyword]
            (data.setdefault(section, {}) if section else data)[field] = value
    if options:
        data.setdefault("merge", {}).setdefault("options", {}).update(options)
    try:
        return config_from_dict(data, where), held
    except DeploytkError as err:
        raise DeploytkError(_in_keywords(err.message, where), hint=err.hint) from None
