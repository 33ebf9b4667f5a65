#!/bin/bash
# lmod_unpack.sh DEST - Lmod for the modules tests, unpacked from Debian's lmod package into DEST
# (the build tree). Debian will not install lmod beside environment-modules (Conflicts:), so the
# .deb is fetched with `apt-get download`, extracted with `dpkg-deb -x`, and its absolute paths
# (/usr/share/lmod, /usr/lib/lmod, /etc/lmod) are rewritten to DEST/root/... Its run-time
# dependencies (lua5.3, lua-posix, lua-filesystem, lua-term, lua-json, tcl) come from
# scripts/install_deps.sh. Init script afterwards: DEST/root/usr/share/lmod/lmod/init/bash.
# Exit 77 (skipped) with the reason when the package cannot be had or Lmod does not run here.
set -euo pipefail
dest=${1:?usage: lmod_unpack.sh DEST}
root=${dest}/root
init=${root}/usr/share/lmod/lmod/init/bash
skip() { echo "SKIPPED: $*"; rm -f "${dest}/ok"; echo "$*" >"${dest}/UNAVAILABLE"; exit 77; }

mkdir -p "${dest}"
rm -f "${dest}/UNAVAILABLE"
if [[ -e "${dest}/ok" && -r "${init}" ]]; then
  echo "Lmod already unpacked in ${dest}: $(<"${dest}/ok")"
  exit 0
fi
for b in lua5.3 tclsh; do
  command -v "${b}" >/dev/null || skip "${b} not found (scripts/install_deps.sh installs Lmod's dependencies)"
done
rm -rf "${root}" "${dest}"/lmod_*.deb
if ! (cd "${dest}" && apt-get download lmod >download.log 2>&1); then
  skip "apt-get download lmod failed: $(tail -n 2 "${dest}/download.log" | tr '\n' ' ')"
fi
deb=$(find "${dest}" -maxdepth 1 -name 'lmod_*.deb' | head -n 1)
[[ -n "${deb}" ]] || skip "apt-get download lmod left no .deb"
dpkg-deb -x "${deb}" "${root}"
grep -rIl -e /usr/share/lmod -e /usr/lib/lmod -e /etc/lmod "${root}" |
  xargs -r sed -i -e "s|/usr/share/lmod|${root}/usr/share/lmod|g" -e "s|/usr/lib/lmod|${root}/usr/lib/lmod|g" \
    -e "s|/etc/lmod|${root}/etc/lmod|g"
[[ -r "${init}" ]] || skip "the lmod package has no ${init#"${root}"}"
# Lmod's default MODULEPATH lists its Core modulefiles; the tests set their own.
: >"${root}/etc/lmod/modulespath"

# shellcheck disable=SC2016  # $1 is the inner shell's
lmod_version=$(env -i HOME="${dest}" PATH=/usr/bin:/bin bash -c '. "$1" && module --version' _ "${init}" 2>&1) || true
ver=$(grep -o 'Version [0-9.]*' <<<"${lmod_version}" | head -n 1) || skip "the unpacked Lmod does not run: $(tail -n 3 <<<"${lmod_version}" | tr '\n' ' ')"
echo "Lmod ${ver} from $(basename "${deb}")" >"${dest}/ok"
echo "unpacked $(<"${dest}/ok") into ${root}"
