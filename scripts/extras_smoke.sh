#!/usr/bin/env bash
# Every extra works on its own (issue 41): for the core package and each extra, a fresh venv with only the torch pair
# and `pip install -e ".[EXTRA]"`, then that extra's smoke command, then the venv is removed. The suite's own venv has
# the [test] extra, whose tritonclient pins protobuf below 7, so it never sees what `pip install -e ".[openvino]"` alone
# resolves (protobuf 7, which broke validate --backend openvino).
#
#   scripts/extras_smoke.sh [EXTRA ...]     (default: core openvino int8 hf serve wheel; `make extras-smoke`)
#
# `wheel` is not an extra but the package as a user gets it (issue 55): deploytk's wheel, built from a copy of the
# checkout's files (tracked and not ignored: a stale build/ cannot leak into it), installed with [openvino] and not
# editable; from a folder outside the checkout it runs the README's CLI steps on a ready-made config by name and the
# README's Python block, read from README.md.
#
# PYTHON (python3) makes the venvs; TORCH_PAIR (the Makefile's) is installed once into a base venv, which each extra's
# venv copies with hard links (`cp -al`: seconds, no disk) before pip resolves the extra into the copy: the extra's
# own dependencies (protobuf, onnx, openvino, ...) are resolved fresh, as on a user's machine, and torch is not
# installed five times (5.5 GB and about a minute each). pip replaces a file by unlinking it, so the base stays as it
# was; the script checks that nothing in it changed. The extras install with --no-compile (a third of pip's time is
# byte-compiling packages the smoke mostly never imports; Python compiles what it imports). The venvs live in a new
# folder under EXTRAS_SMOKE_DIR (default: TMPDIR or /tmp; about 7 GB free, checked first), removed at the end.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH_PAIR="${TORCH_PAIR:-$(sed -n 's/^TORCH_PAIR := //p' "$ROOT/Makefile")}"
EXTRAS=("$@")
[ ${#EXTRAS[@]} -gt 0 ] || EXTRAS=(core openvino int8 hf serve wheel)
WORK="$(mktemp -d -p "${EXTRAS_SMOKE_DIR:-${TMPDIR:-/tmp}}" deploytk-extras.XXXXXX)" || exit 1
trap 'rm -rf "$WORK"' EXIT
export DEPLOYTK_CACHE="$WORK/cache" # the dense baselines quantize exports: this run's, never the user's ~/.cache
PIP=(-m pip install --quiet --disable-pip-version-check)
CONFIG="$ROOT/export_configs/digits_vit_tome_r4.yaml" # the digits ViT: its weights ship in assets/, no download
SHOWN=(torch torchvision numpy protobuf onnx onnxruntime openvino nncf transformers tritonclient)

fail() { # the extra, the step, and the log of the step
	echo "extras-smoke: FAILED [$1]: $2" >&2
	[ -f "$3" ] && tail -n 40 "$3" >&2
	exit 1
}

step() { # extra, log file, what, command...: run it, fail loudly with the extra's name when it fails
	local extra=$1 log=$2 what=$3 t0
	shift 3
	t0=$(date +%s)
	"$@" >"$log" 2>&1 || fail "$extra" "$what (exit $?)" "$log"
	echo "  [$extra] $what: $(($(date +%s) - t0)) s"
}

versions() { # what pip resolved in a venv, one line
	"$1/bin/python" - "${SHOWN[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version


def have(name):
    try:
        return f"{name} {version(name)}"
    except PackageNotFoundError:
        return None


print("resolved: " + ", ".join(filter(None, map(have, sys.argv[1:]))))
EOF
}

for extra in "${EXTRAS[@]}"; do # before the base venv's minute: a name without a smoke command
	case "$extra" in
	core | openvino | int8 | hf | serve | wheel) ;;
	*) fail "$extra" "no smoke command for this extra (core, openvino, int8, hf, serve, wheel)" /dev/null ;;
	esac
done

# The base venv is 5.5 GB and each extra's packages add a few hundred MB: refuse up front, naming the folder, rather
# than fail inside pip with "No space left on device" (what CI printed at stop 49).
NEED_GB=${EXTRAS_SMOKE_NEED_GB:-7}
free_gb=$(($(df -Pk "$WORK" | awk 'NR == 2 {print $4}') / 1024 / 1024))
[ "$free_gb" -ge "$NEED_GB" ] || fail disk "$free_gb GB free in $(dirname "$WORK"), about $NEED_GB GB needed: free some (old pytest-of-* folders?) or set EXTRAS_SMOKE_DIR to a roomier folder" /dev/null

start=$(date +%s)
BASE="$WORK/base"
echo "extras-smoke: base venv ($PYTHON, $TORCH_PAIR) in $BASE"
step base "$WORK/base.log" "venv + $TORCH_PAIR" bash -c "'$PYTHON' -m venv '$BASE' && '$BASE/bin/python' ${PIP[*]} $TORCH_PAIR"
touch "$WORK/base.stamp"
sleep 1 # file times have one-second resolution on some file systems: a change in the same second must still show

for extra in "${EXTRAS[@]}"; do
	t0=$(date +%s)
	venv="$WORK/venv-$extra" run="$WORK/run-$extra" log="$WORK/$extra.log"
	spec="$ROOT"
	[ "$extra" = core ] || spec="$ROOT[$extra]"
	rm -rf "$venv" "$run" && mkdir -p "$run"
	cp -al "$BASE" "$venv" || fail "$extra" "cp -al of the base venv" /dev/null
	if [ "$extra" = wheel ]; then
		src="$WORK/src" dist="$WORK/dist"
		mkdir -p "$src" "$dist"
		step "$extra" "$log" "copy the checkout's files" bash -c "cd '$ROOT' && git ls-files -z -c -o --exclude-standard | xargs -0 cp --parents -t '$src'"
		step "$extra" "$log" "build the wheel" "$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$dist" "$src"
		wheel_file=$(ls "$dist"/deploytk-*.whl)
		step "$extra" "$log" "pip install $(basename "$wheel_file")[openvino]" "$venv/bin/python" "${PIP[@]}" --no-compile "$wheel_file[openvino]"
	else
		step "$extra" "$log" "pip install -e '$spec'" "$venv/bin/python" "${PIP[@]}" --no-compile -e "$spec"
	fi
	echo "  [$extra] $(versions "$venv")"
	py="$venv/bin/python"
	dt() { "$py" -m deploytk "$@"; } # the copy's console scripts would name the base's python: run the module
	cd "$run" || exit 1
	case "$extra" in
	core)
		step "$extra" "$log" "export $(basename "$CONFIG")" dt export "$CONFIG" --output art
		step "$extra" "$log" "validate --backend ort" dt validate art --backend ort --num-samples 16
		;;
	openvino)
		step "$extra" "$log" "export $(basename "$CONFIG")" dt export "$CONFIG" --output art
		step "$extra" "$log" "validate --backend openvino" dt validate art --backend openvino --num-samples 16
		# without [int8], quantize refuses with the extra to install (exit 2), not a traceback
		echo "  [$extra] quantize --backend openvino refuses without NNCF"
		dt quantize art --backend openvino --synthetic 16 --output art-int8 >"$log" 2>&1
		rc=$?
		{ [ $rc -eq 2 ] && grep -q "deploytk\[int8\]" "$log" && [ ! -e art-int8 ]; } ||
			fail "$extra" "quantize without NNCF: exit $rc, wanted 2 naming deploytk[int8] and writing nothing" "$log"
		;;
	int8)
		step "$extra" "$log" "export $(basename "$CONFIG")" dt export "$CONFIG" --output art
		step "$extra" "$log" "quantize --backend openvino" dt quantize art --backend openvino --synthetic 32 --output art-int8
		step "$extra" "$log" "validate the int8 IR --backend openvino" dt validate art-int8 --backend openvino --num-samples 16
		;;
	hf)
		# a transformers family: a tiny ViT built from a config with seeded random weights (no download), named by hf:
		step "$extra" "$log" "save_pretrained a tiny ViTForImageClassification" "$py" -c '
import torch, transformers
torch.manual_seed(0)
config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=128,
                                image_size=32, patch_size=4, num_labels=10)
transformers.ViTForImageClassification(config).eval().save_pretrained("vit")
open("hf_vit_tome.yaml", "w").write("model: hf:vit\nmerge:\n  method: tome\n  r: 4\nexport:\n  img_size: null\n  batch_size: 2\n")'
		step "$extra" "$log" "export hf:vit (tome r=4)" dt export hf_vit_tome.yaml --output art
		step "$extra" "$log" "validate --backend ort" dt validate art --backend ort --num-samples 16
		;;
	wheel)
		step "$extra" "$log" "deploytk imported from the installed wheel, not the checkout" "$py" -c "
import deploytk, deploytk.ready_made as r, sys
assert deploytk.__file__.startswith(sys.prefix) and r.FOLDER.is_relative_to(sys.prefix), (deploytk.__file__, r.FOLDER)"
		step "$extra" "$log" "configs lists the ready-made configs" bash -c "'$py' -m deploytk configs --json | grep -q deit_small_tome_r16"
		step "$extra" "$log" "export deit_small_tome_r16 --output x" dt export deit_small_tome_r16 --output x
		step "$extra" "$log" "validate x" dt validate x
		step "$extra" "$log" "profile x" dt profile x
		step "$extra" "$log" "export and validate digits_vit_tome_r4 (its checkpoint in the wheel)" bash -c "'$py' -m deploytk export digits_vit_tome_r4 --output digits && '$py' -m deploytk validate digits --num-samples 16"
		"$py" -c 'import re, sys; print(re.search(r"## From Python.*?```python\n(.*?)```", open(sys.argv[1], encoding="utf-8").read(), re.S).group(1))' "$ROOT/README.md" >readme_python.py
		step "$extra" "$log" "the README's Python block" "$py" readme_python.py
		;;
	serve)
		step "$extra" "$log" "export $(basename "$CONFIG")" dt export "$CONFIG" --output art
		step "$extra" "$log" "package --triton" dt package art --triton repo --name digits
		# the repository's config.pbtxt, parsed with Triton's own protobuf schema from tritonclient
		step "$extra" "$log" "parse config.pbtxt with tritonclient's model_config_pb2" "$py" -c '
from google.protobuf import text_format
import tritonclient.grpc, tritonclient.http
from tritonclient.grpc import model_config_pb2
config = text_format.Parse(open("repo/digits/config.pbtxt").read(), model_config_pb2.ModelConfig())
assert config.name == "digits" and config.backend == "onnxruntime" and config.max_batch_size == 8, config'
		;;
	esac
	cd "$ROOT" || exit 1
	echo "  [$extra] passed in $(($(date +%s) - t0)) s"
	rm -rf "$venv" "$run" & # unlinking 25,000 files takes a while: meanwhile the next extra runs
done
wait

changed=$(find "$BASE" -newer "$WORK/base.stamp" -type f | head -5)
[ -z "$changed" ] || fail base "an extra's install wrote into the shared base venv through a hard link: $changed" /dev/null
rm -rf "$WORK" # the base's 5.5 GB: its removal is part of the time
echo "extras-smoke: passed (${EXTRAS[*]}) in $(($(date +%s) - start)) s, the venvs removed"
