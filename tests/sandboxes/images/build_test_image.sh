#!/usr/bin/env bash
# Builds the OCI test image `rein-py-env` (Debian bookworm minbase + python3, pytest, git) with mmdebstrap and
# umoci, as an OCI layout directory, plus the same image as a `docker save`-style archive made by skopeo.
# Usage: build_test_image.sh OUT_DIR   (writes OUT_DIR/rein-py-env (OCI layout, tag "latest") and
# OUT_DIR/rein-py-env.tar (docker-archive), the layout of an image store: see components/tasks/swebench.py)
# Needs root, mmdebstrap, umoci, skopeo and the Debian mirror configured in /etc/apt (set-up only).
set -euo pipefail
out=${1:?usage: build_test_image.sh OUT_DIR}
mkdir -p "$out"
work=$(mktemp -d "$out/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase --include=python3,python3-pytest,git,patch \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  bookworm "$work/rootfs.tar"
umoci init --layout "$work/oci"
umoci new --image "$work/oci:latest"
umoci unpack --image "$work/oci:latest" "$work/bundle"
tar -xf "$work/rootfs.tar" -C "$work/bundle/rootfs" --exclude='./dev/*'
mkdir -p "$work/bundle/rootfs/testbed"
umoci repack --image "$work/oci:latest" "$work/bundle"
umoci config --image "$work/oci:latest" --config.workingdir /testbed --config.env PATH=/usr/local/bin:/usr/bin:/bin
umoci gc --layout "$work/oci"
skopeo copy --quiet "oci:$work/oci:latest" "docker-archive:$work/rein-py-env.tar:rein-py-env:latest"
rm -rf "$out/rein-py-env" "$out/rein-py-env.tar"
mv "$work/oci" "$out/rein-py-env"
mv "$work/rein-py-env.tar" "$out/rein-py-env.tar"
echo "built $out/rein-py-env (oci:…:latest) and $out/rein-py-env.tar"
