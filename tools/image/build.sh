#!/usr/bin/env bash
# Build Tessera's image from daemonset/Dockerfile, daemonless and offline, into OUTDIR:
#   OUTDIR/tessera.tar   the image as an OCI archive (what the e2e nodes' containerd imports)
#   OUTDIR/pause.tar     the pod sandbox image the nodes' containerd needs (Kubernetes' own
#                        pause.c from the k8s.io/kubernetes module tools/k8s pins, built static)
#   OUTDIR/image.env     IMAGE (its name), IMAGE_ID (the config digest: equal for two builds
#                        of one commit on one base), PAUSE_IMAGE
# Usage: build.sh OUTDIR; env PYTHON (the venv's python, for the wheelhouse), GO, CACHE.
#        build.sh --rebuild-id: build once more from the same base and wheelhouse (after a
#        build) under a scratch tag, print that image's ID and drop the tag (the test that
#        two builds of one commit give one image).
#
# No registry is reachable here, so the base is made locally: a Debian root filesystem
# (mmdebstrap, minbase) with Debian's Python of the same minor version as the one building,
# cached by suite and package list, passed as --build-arg BASE. The Dockerfile's own default
# (python:3.11-slim) stays for users. The wheels come from the building venv's resolution
# (pip wheel, from its cache) so the build installs with --no-index what the tests ran.
# buildah runs rootful with the vfs driver and chroot isolation: nothing else is needed on
# the machine (Debian's buildah, mmdebstrap, umoci packages; see the Makefile's container-tools).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
OUTDIR=${1:?usage: build.sh OUTDIR | --rebuild-id}
PYTHON=${PYTHON:-$repo/.venv/bin/python}
GO=${GO:-go}
CACHE=${CACHE:-$HOME/.cache/tessera/image}
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates
VERSION=$("$PYTHON" -c 'import tessera; print(tessera.__version__)')
IMAGE=localhost/tessera:$VERSION
PAUSE_IMAGE=localhost/pause:3.10
store=(--root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)
mkdir -p "$CACHE"

build() {  # build TAG: the Dockerfile as users build it, offline, with fixed timestamps
  buildah "${store[@]}" bud --quiet --isolation chroot --timestamp 0 --layers=false \
    --build-arg BASE="$BASE" --build-arg PIP_NO_INDEX=1 \
    --build-arg PIP_FIND_LINKS=/src/build/image/wheels \
    -f "$repo/daemonset/Dockerfile" -t "$1" "$repo" >/dev/null
  buildah "${store[@]}" inspect --type image --format '{{.FromImageID}}' "$1"
}

# The base root filesystem, once per suite and package list.
base_key=$(printf '%s %s' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
base_tar=$CACHE/base-$SUITE-$base_key.tar
BASE=localhost/tessera-base:$SUITE-$base_key
if [ "$OUTDIR" = --rebuild-id ]; then
  build localhost/tessera:rebuild
  buildah "${store[@]}" rmi localhost/tessera:rebuild >/dev/null 2>&1 || true
  exit 0
fi
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
if [ ! -e "$base_tar" ]; then
  SOURCE_DATE_EPOCH=0 mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' "$SUITE" "$CACHE/partial-${base_tar##*/}"
  mv "$CACHE/partial-${base_tar##*/}" "$base_tar"  # (mmdebstrap writes a tar for *.tar)
fi
if ! buildah "${store[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  c=$(buildah "${store[@]}" from scratch)
  buildah "${store[@]}" add "$c" "$base_tar" / >/dev/null
  buildah "${store[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
  buildah "${store[@]}" commit --quiet --timestamp 0 --rm "$c" "$BASE" >/dev/null
fi

# The wheelhouse, inside the build context (.dockerignore lets build/image/wheels through).
wheels=$repo/build/image/wheels
rm -rf "$wheels"
mkdir -p "$wheels"
(cd "$repo" && "$PYTHON" -m pip wheel --quiet --wheel-dir "$wheels" . \
  && "$PYTHON" -m pip download --quiet --dest "$wheels" "setuptools>=77")
rm -f "$wheels"/tessera-*.whl

IMAGE_ID=$(build "$IMAGE")
rm -f "$OUTDIR/tessera.tar"
buildah "${store[@]}" push --quiet "$IMAGE" "oci-archive:$OUTDIR/tessera.tar:$IMAGE"

# The sandbox image every pod needs, from Kubernetes' own source.
k8s_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$repo/tools/k8s/go.mod")
pause_c=$(cd "$repo/tools/k8s" && "$GO" list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -Os -static -Wall -Werror -DVERSION="3.10-$k8s_version" -o "$work/pause" "$pause_c"
c=$(buildah "${store[@]}" from scratch)
buildah "${store[@]}" copy "$c" "$work/pause" /pause >/dev/null
buildah "${store[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$c"
buildah "${store[@]}" commit --quiet --timestamp 0 --rm "$c" "$PAUSE_IMAGE" >/dev/null
rm -f "$OUTDIR/pause.tar"
buildah "${store[@]}" push --quiet "$PAUSE_IMAGE" "oci-archive:$OUTDIR/pause.tar:$PAUSE_IMAGE"

cat > "$OUTDIR/image.env" <<END
IMAGE=$IMAGE
IMAGE_ID=$IMAGE_ID
PAUSE_IMAGE=$PAUSE_IMAGE
BASE=$BASE
STORAGE=$CACHE
END
echo "image $IMAGE: $IMAGE_ID (in $OUTDIR/tessera.tar)"
