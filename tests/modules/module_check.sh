#!/bin/bash
# module_check.sh envmod|lmod basic|prereqs PREFIX WORK SOURCE_DIR [LMOD_DIR]
#
# The installed modulefile as a user meets it, in a clean `bash -c` (env -i) that sources the
# module system's init script:
#   basic:   module use + module load hpctrain puts PREFIX/bin first on PATH and sets HPCTRAIN_HOME;
#            pretrain_gpt --help runs; whatis/help answer (help names hpct_ckpt); a second hpctrain never joins the first
#            (Environment Modules refuses it: conflict; Lmod swaps it: one name, one version);
#            module unload restores PATH exactly and every other variable.
#   prereqs: the same modulefile rendered with HPCT_MODULE_PREREQS="fakempi/4.1;fakehdf5/1.14"
#            (two stand-in site modules): loading hpctrain loads both, unloading it unloads them,
#            and PATH is again exactly what it was.
# Environment Modules is Debian's (/usr/share/modules); Lmod is the one lmod_unpack.sh unpacked
# into LMOD_DIR. Exit 77 (skipped) when that module system is not there.
set -euo pipefail
flavour=${1:?usage: module_check.sh envmod|lmod basic|prereqs PREFIX WORK SOURCE_DIR [LMOD_DIR]}
what=${2:?}
prefix=${3:?}
work=${4:?}
src=${5:?}
lmod_dir=${6:-}

case "${flavour}" in
  envmod)
    init=/usr/share/modules/init/bash
    [[ -r "${init}" ]] || { echo "SKIPPED: Environment Modules is not installed (${init}; Debian: environment-modules)"; exit 77; }
    ;;
  lmod)
    if [[ -e "${lmod_dir}/UNAVAILABLE" ]]; then echo "SKIPPED: no Lmod: $(<"${lmod_dir}/UNAVAILABLE")"; exit 77; fi
    init=${lmod_dir}/root/usr/share/lmod/lmod/init/bash
    [[ -r "${init}" ]] || { echo "FAIL: no Lmod in ${lmod_dir} (the lmod_unpack fixture did not run)"; exit 1; }
    ;;
  *) echo "unknown module system ${flavour}" >&2; exit 2 ;;
esac

rm -rf "${work}"
mkdir -p "${work}/home" "${work}/modulefiles/hpctrain"
mfs=("${prefix}"/modulefiles/hpctrain/*)
[[ -f "${mfs[0]}" ]] || { echo "FAIL: no modulefile in ${prefix}/modulefiles/hpctrain"; exit 1; }
version=$(basename "${mfs[0]}")

if [[ "${what}" == basic ]]; then
  modpath=${prefix}/modulefiles
  # A second version of hpctrain, in another directory of MODULEPATH, for the conflict check.
  sed 's/^setenv HPCTRAIN_VERSION .*/setenv HPCTRAIN_VERSION 9.9.9/' "${mfs[0]}" >"${work}/modulefiles/hpctrain/9.9.9-other"
  modpath2=${work}/modulefiles
  load=hpctrain
else
  # The same template and render script `cmake --install` uses, with two site modules to load.
  cmake -DHPCT_MF_TEMPLATE="${src}/modulefiles/hpctrain.tcl.in" -DHPCT_MF_OUTPUT="${work}/modulefiles/hpctrain/${version}" \
    -DHPCT_MF_ROOT="${prefix}" -DHPCT_VERSION="${version%%-*}" -DHPCT_MF_VERSION="${version}" \
    "-DHPCT_MF_PREREQS=fakempi/4.1;fakehdf5/1.14" -P "${src}/modulefiles/render_modulefile.cmake"
  grep -q '^module load fakempi/4.1$' "${work}/modulefiles/hpctrain/${version}" || { echo "FAIL: no 'module load fakempi/4.1'"; exit 1; }
  for m in fakempi/4.1 fakehdf5/1.14; do
    mkdir -p "${work}/site/${m}/bin" "${work}/sitemodules/${m%/*}"
    {
      echo "#%Module1.0"
      echo "module-whatis \"stand-in site module ${m}\""
      echo "prepend-path PATH ${work}/site/${m}/bin"
      name=${m%/*}
      echo "setenv ${name^^}_ROOT ${work}/site/${m}"
    } >"${work}/sitemodules/${m}"
  done
  modpath=${work}/modulefiles
  modpath2=${work}/sitemodules
  load=hpctrain/${version}
fi

# shellcheck disable=SC2016  # expanded by the inner shell
inner='
set -eo pipefail
fail() { echo "FAIL: $*"; exit 1; }
vars() {  # the exported environment minus the module systems own bookkeeping
  env | grep -Ev "^(MODULEPATH|LOADEDMODULES|_LMFILES_|MODULESHOME|MODULES_[A-Z_]*|__MODULES_[A-Z_]*|_ModuleTable[A-Za-z0-9_]*|__LMOD_[A-Z_]*|LMOD_[A-Z_]*|BASH_FUNC_[a-z_]*%%|_|SHLVL|OLDPWD|PWD)=" | sort
}
init=$1 flavour=$2 what=$3 prefix=$4 modpath=$5 modpath2=$6 load=$7
. "$init"
type module >/dev/null 2>&1 || fail "module is not a command after sourcing $init"
path0=$PATH
env0=$(vars)
module use "$modpath2"
module use "$modpath"

module load "$load" || fail "module load $load failed"
echo "after load: PATH=$PATH"
[[ "$(command -v pretrain_gpt)" == "$prefix/bin/pretrain_gpt" ]] || fail "pretrain_gpt is $(command -v pretrain_gpt), not from $prefix"
[[ "${HPCTRAIN_HOME:-}" == "$prefix" ]] || fail "HPCTRAIN_HOME=${HPCTRAIN_HOME:-unset}"
[[ -d "$HPCTRAIN_HOME/share/hpctrain/slurm" ]] || fail "no slurm templates under HPCTRAIN_HOME"
# Captured first: `grep -q` quits at the first match, and a help text longer than one pipe write
# then dies of SIGPIPE, which pipefail reports as a failure.
help_text=$(pretrain_gpt --help)
grep -q -- --global-batch-size <<<"${help_text}" || fail "pretrain_gpt --help does not list --global-batch-size"
module whatis hpctrain 2>&1 | grep -q "MPI-native training" || fail "module whatis lacks the description"
module help hpctrain 2>&1 | grep -q "job templates" || fail "module help lacks the help text"
module help hpctrain 2>&1 | grep -q "hpct_ckpt list|verify|export|import|merge-lora" || fail "module help does not name the hpct_ckpt commands"
for app in pretrain_gpt pretrain_moe finetune generate preprocess_data analyze_data nvme_bench ib_healthcheck; do
  module help hpctrain 2>&1 | grep -q "${app}" || fail "module help does not name ${app}"
done

if [[ "$what" == basic ]]; then
  [[ "$PATH" == "$prefix/bin:$path0" ]] || fail "PATH after load is $PATH"
  module load hpctrain/9.9.9-other >/dev/null 2>&1 || true
  n=$(module -t list 2>&1 | grep -c "^hpctrain/") || true
  [[ "$n" == 1 ]] || fail "$n hpctrain modules loaded at once: $(module -t list 2>&1 | tr "\n" " ")"
  echo "a second hpctrain: $(module -t list 2>&1 | grep "^hpctrain/") stays alone ($flavour)"
else
  for m in fakempi/4.1 fakehdf5/1.14; do
    module -t list 2>&1 | grep -qx "$m" || fail "$m not loaded with hpctrain: $(module -t list 2>&1 | tr "\n" " ")"
  done
  [[ "${FAKEMPI_ROOT:-}" == */site/fakempi/4.1 ]] || fail "FAKEMPI_ROOT=${FAKEMPI_ROOT:-unset}"
  echo "prereqs loaded: $(module -t list 2>&1 | tr "\n" " ")"
fi

module unload hpctrain || fail "module unload hpctrain failed"
left=$(module -t list 2>&1 | grep -E "^(hpctrain|fake)" || true)
[[ -z "$left" ]] || fail "still loaded after unload: $left"
[[ "$PATH" == "$path0" ]] || fail "PATH after unload is $PATH, was $path0"
[[ -z "${HPCTRAIN_HOME+x}" ]] || fail "HPCTRAIN_HOME still set"
env1=$(vars)
[[ "$env0" == "$env1" ]] || { diff <(echo "$env0") <(echo "$env1") || true; fail "environment differs after unload"; }
echo "PASS: $flavour $what: load, run, unload restores PATH=$PATH exactly"
'
env -i HOME="${work}/home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TERM=dumb \
  bash -c "${inner}" _ "${init}" "${flavour}" "${what}" "${prefix}" "${modpath}" "${modpath2}" "${load}"
