#!/usr/bin/env bash
# Fetches real photographs for `tutti bench decode`: the wallpapers shipped in
# Debian's plasma-workspace-wallpapers and gnome-backgrounds packages
# (JPEG, PNG and WebP up to ~17 MP), unpacked into a cache directory.
#   tools/fetch_photos.sh [CACHE_DIR]   (default ~/.cache/tutti/photos)
# Prints the directory holding jpeg/, png/ and webp/ subdirectories.
set -euo pipefail
CACHE="${1:-${HOME:-/tmp}/.cache/tutti/photos}"
if [ -d "$CACHE/jpeg" ] && [ -n "$(ls -A "$CACHE/jpeg" 2>/dev/null)" ]; then
  echo "$CACHE"; exit 0
fi
mkdir -p "$CACHE/debs" "$CACHE/root" "$CACHE/jpeg" "$CACHE/png" "$CACHE/webp"
cd "$CACHE/debs"
if ! apt-get download plasma-workspace-wallpapers gnome-backgrounds >/dev/null 2>&1; then
  echo "fetch_photos: refreshing the package lists" >&2
  apt-get update -qq >&2
  apt-get download plasma-workspace-wallpapers gnome-backgrounds >&2
fi
for d in *.deb; do dpkg -x "$d" "$CACHE/root"; done
i=0
while IFS= read -r -d '' f; do
  i=$((i + 1))
  case "${f,,}" in
    *.jpg|*.jpeg) cp "$f" "$CACHE/jpeg/$i.jpg" ;;
    *.png) cp "$f" "$CACHE/png/$i.png" ;;
    *.webp) cp "$f" "$CACHE/webp/$i.webp" ;;
  esac
done < <(find "$CACHE/root" -type f \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' -o -iname '*.webp' \) -size +200k -print0)
rm -rf "$CACHE/root" "$CACHE/debs"
echo "$CACHE"
