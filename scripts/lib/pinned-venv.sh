# pinned-venv.sh — sourced by scripts/engines-venv.sh and scripts/vllm-cpu-venv.sh:
# builds a virtualenv of Debian's python3 from exact pins, idempotently.
#
# The caller sets, then calls `pinned_venv_build VENV_DIR`:
#   VENV_NAME     a short name for log lines ("vllm-venv")
#   STAMP_FORMAT  bumped when the procedure changes without a pin change
#   TORCH_PKGS    array: installed with dependency resolution (torch and what
#                 it pins: the NVIDIA wheels), every one pinned with ==
#   NODEPS_PKGS   array: installed with --no-deps (the engine and the light
#                 dependencies its modules import)
#   SMOKE_PY      Python source that must run in the venv for it to count as
#                 complete (imports, version asserts)
#   STEP2_MSG, STEP3_MSG  what steps 2 and 3 install, for the log
#   NEED_GB       free disk (GiB) an install needs: the venv plus pip's
#                 downloaded wheels in TMPDIR, when both are on one disk
#
# After a complete install a stamp file in the venv holds the pin list; a
# later run with the same pins exits at once with no network access.
# Changing a pin invalidates the stamp and reinstalls into the same venv
# (pins already satisfied there are not fetched again). Concurrent runs
# (a developer and CI on one machine) serialize on a lock file beside the
# venv. pip's output goes to a log in the venv, shown when a step fails.

PYTHON=/usr/bin/python3  # Debian's python3.11; python3-venv has the venv module

log() { printf '[%s] %s\n' "$VENV_NAME" "$*"; }
die() { printf '[%s] error: %s\n' "$VENV_NAME" "$*" >&2; exit 1; }

pinned_venv_build() {
  local venv=$1
  mkdir -p "$(dirname "$venv")"
  venv=$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")
  local stamp=$venv/.pinned-venv.stamp py=$venv/bin/python
  [[ -x $PYTHON ]] || die "$PYTHON not found (apt-get install python3)"
  # The stamp records everything that determines the venv's contents.
  local expected_stamp
  expected_stamp=$(
    printf 'format=%s name=%s\n' "$STAMP_FORMAT" "$VENV_NAME"
    printf 'python=%s\n' "$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
    printf '%s\n' "${TORCH_PKGS[@]}" "${NODEPS_PKGS[@]}"
  )
  if [[ -x $py && -f $stamp ]] && [[ "$(cat "$stamp")" == "$expected_stamp" ]]; then
    log "up to date: $venv"
    return 0
  fi
  exec 9>"$venv.lock"
  flock 9
  if [[ -x $py && -f $stamp ]] && [[ "$(cat "$stamp")" == "$expected_stamp" ]]; then
    log "up to date: $venv (built by a concurrent run)"
    return 0
  fi
  "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null \
    || die "the venv module is incomplete (apt-get install python3-venv)"
  _pinned_venv_check_disk "$venv"
  # Invalidate first: a run that dies part-way must not leave a matching stamp.
  rm -f "$stamp"
  if [[ -x $py ]]; then
    log "step 1/5: reusing venv $venv"
  else
    log "step 1/5: creating venv $venv with $PYTHON"
    "$PYTHON" -m venv "$venv"
  fi
  pip_log=$venv/.pinned-venv.pip.log
  : >"$pip_log"
  # Plain `pip install` against PyPI: the default torch wheel is the CUDA
  # build. No pip cache: the venv and its stamp are the reuse (a pin change
  # keeps what is still satisfied), and a cache would hold another ~3 GB of
  # wheels per venv on the disk the check above measured.
  local pip_install=("$py" -m pip install --no-input --disable-pip-version-check
                     --no-cache-dir)
  log "step 2/5: installing $STEP2_MSG"
  _pinned_venv_logged "${pip_install[@]}" "${TORCH_PKGS[@]}"
  log "step 3/5: installing $STEP3_MSG (--no-deps)"
  _pinned_venv_logged "${pip_install[@]}" --no-deps "${NODEPS_PKGS[@]}"
  log "step 4/5: checking that the modules import on this machine"
  # HF_HUB_OFFLINE: nothing here may reach the Hugging Face hub.
  _pinned_venv_logged env HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 "$py" -c "$SMOKE_PY"
  log "step 5/5: writing stamp $stamp"
  printf '%s\n' "$expected_stamp" >"$stamp.tmp"
  mv "$stamp.tmp" "$stamp"
  log "done: $venv ($(du -sh "$venv" | cut -f1))"
}

# Fails before pip starts when the disk cannot hold the install, naming what
# to free, instead of pip's "No space left on device" minutes later with a
# half-installed venv. Counts what a venv already there holds as reusable.
_pinned_venv_check_disk() {
  local venv=$1 dir have_gb held_gb=0
  dir=$(dirname "$venv")
  have_gb=$(df --output=avail -B1G "$dir" | tail -n 1 | tr -d ' ')
  [[ -d $venv ]] && held_gb=$(du -s -B1G "$venv" | cut -f1)
  if (( have_gb + held_gb < NEED_GB )); then
    die "$(printf '%s needs about %d GiB free on the disk of %s; it has %d GiB free%s. Free space (other engine virtualenvs under build/ are caches: rm -rf build/*-venv) or set TIERKV_ENGINE_VENVS=drop for scripts/test.sh' \
      "$VENV_NAME" "$NEED_GB" "$dir" "$have_gb" \
      "$( (( held_gb )) && printf ' (+%d GiB in the venv there)' "$held_gb")")"
  fi
}

_pinned_venv_logged() {
  if ! "$@" >>"$pip_log" 2>&1; then
    tail -n 40 "$pip_log" >&2
    die "step failed; full log: $pip_log"
  fi
}
