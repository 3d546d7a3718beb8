#!/usr/bin/env bash
# Create one virtual environment per peer framework under benchmarks/.venvs/<name>
# (benchmarks/run.py runs each peer there; a missing one is named in its rows).
#
# Every venv gets torch==2.13.0 first (the CPU wheel on disk; any other torch
# version would download GBs of CUDA), then its framework.  Idempotent: a venv
# that already imports its framework is left alone.  Usage (from anywhere):
#     bash benchmarks/setup_peers.sh
#
# Versions installed when this was written (Python 3.11.7, torch 2.13.0+cpu):
#   lightning: pytorch-lightning 2.6.6 (lightning-utilities 0.15.3, torchmetrics 1.9.0),
#              mlflow-skinny 3.17.2 (the client Lightning's MLFlowLogger needs)
#   ignite:    pytorch-ignite 0.5.5
#   composer:  mosaicml 0.32.1 (--no-deps; its release pins torch<2.8) plus the
#              COMPOSER_DEPS below, found by trial (import composer, build a
#              Trainer with a callback, fit).  torchvision 0.28.0 is the release
#              that matches torch 2.13; PyPI only has CUDA builds of it, whose
#              C ops cannot load next to a CPU torch.  composer only needs its
#              Python side (composer.utils.misc imports torchvision.transforms),
#              so harness/frameworks/composer_fw.py declares the two ops torchvision
#              0.28 registers fakes for (nms, qnms) before importing composer.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$HERE/.venvs"
PYTHON="${PYTHON:-python3.11}"
TORCH="torch==2.13.0"
COMPOSER_DEPS=(
  numpy requests urllib3 idna certifi charset-normalizer tqdm torchvision==0.28.0
  pillow py-cpuinfo importlib-metadata lazy_importer psutil torchmetrics
  lightning-utilities packaging pyyaml coolname
  # composer.loggers imports the MosaicML platform client (mcli) and its imports:
  mosaicml-cli backoff gql graphql-core anyio tenacity websockets rich
  ruamel.yaml questionary prompt_toolkit wcwidth python-dateutil validators
)

# name -> python statement that proves the framework imports.
declare -A CHECK=(
  [lightning]="import pytorch_lightning"
  [ignite]="import ignite.engine"
  [composer]="import sys; sys.path[:0] = ['$HERE']; import harness.frameworks.composer_fw"
)

install() {  # install NAME: the framework's packages into an existing venv
  local pip="$VENVS/$1/bin/python -m pip install -q --disable-pip-version-check"
  $pip "$TORCH"
  case "$1" in
    # mlflow-skinny: Lightning's MLFlowLogger, for the MLflow study (docs/performance-notes.md)
    # tensorboard: the users_callbacks row's TensorBoard loggers (suite/users_callbacks.py)
    lightning) $pip pytorch-lightning 'mlflow-skinny==3.17.2' tensorboard ;;
    ignite) $pip pytorch-ignite numpy ;;  # numpy only silences torch's import warning
    composer)
      $pip --no-deps 'mosaicml==0.32.*'
      $pip --no-deps "${COMPOSER_DEPS[@]}"
      $pip tensorboard ;;  # the users_callbacks row: Composer's TensorboardLogger
  esac
}

for name in lightning ignite composer; do
  py="$VENVS/$name/bin/python"
  if [[ -x "$py" ]] && "$py" -c "${CHECK[$name]}" 2>/dev/null; then
    echo "== $name: ready, skipped"
    continue
  fi
  echo "== $name: installing"
  [[ -x "$py" ]] || "$PYTHON" -m venv "$VENVS/$name"
  install "$name"
  "$py" -c "${CHECK[$name]}"
done

echo "== versions"
for name in lightning ignite composer; do
  "$VENVS/$name/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
    | grep -iE '^(torch|pytorch-lightning|pytorch-ignite|mosaicml|torchvision) ' \
    | awk -v n="$name" '{printf "%-10s %s %s\n", n, $1, $2}'
done
