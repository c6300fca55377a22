#!/usr/bin/env bash
# The repository stands alone. Fails when a tracked file
#   - names one of the team's old outside notes (the numerics, architecture,
#     style or device notes) or a path into the folder that held them, or a
#     path on one particular machine (the patterns are in `forbidden` below);
#   - points into docs/numerics.md by a heading it lacks. A pointer is the path,
#     a comma and the heading in double quotes (more quoted headings may follow,
#     joined by commas, "and" or "or"), all on one line;
#   - names a docs/*.md file that does not exist.
#
# Which tree: the one given as $1, else the checked-in tree this test was built
# from, found through the runfile of README.md (//:readme_and_docs), which is a
# link into the source tree. Its files are git's (tracked, and untracked ones
# that .gitignore does not exclude), or, without git, every file outside .git,
# bazel-* and the ignored output folders. Bazel cannot
# see those inputs, so tests/BUILD tags this test external (never cached) and
# local (no sandbox).
set -uo pipefail

find_root() {
  if [ $# -gt 0 ]; then
    (cd "$1" && pwd)
    return
  fi
  local readme=""
  for candidate in "${TEST_SRCDIR:-}/${TEST_WORKSPACE:-keel}/README.md" "$PWD/README.md"; do
    if [ -e "$candidate" ]; then readme=$candidate; break; fi
  done
  if [ -z "$readme" ] && [ -n "${RUNFILES_MANIFEST_FILE:-}" ]; then
    readme=$(awk '$1 ~ /\/README\.md$/ && $1 !~ /external/ {print $2; exit}' "$RUNFILES_MANIFEST_FILE")
  fi
  if [ -z "$readme" ]; then
    echo "FAIL: README.md is not among the runfiles (data = [\"//:readme_and_docs\"])" >&2
    return 1
  fi
  dirname "$(readlink -f "$readme")"
}

root=$(find_root "$@") || exit 1
numerics="$root/docs/numerics.md"
if [ ! -f "$numerics" ]; then
  echo "FAIL: $root has no docs/numerics.md"
  exit 1
fi
cd "$root" || exit 1

# The files to check, NUL-separated: tracked files, or every file in the tree.
list=$(mktemp)
trap 'rm -f "$list"' EXIT
if git -C "$root" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  git -C "$root" ls-files -z --cached --others --exclude-standard > "$list"
  how="git ls-files"
else
  find . \( -name .git -o -name 'bazel-*' -o -path ./dist -o -path ./data -o -path ./runs \
            -o -path ./.refs -o -path ./device-out -o -name __pycache__ \) -prune \
         -o -type f -print0 | sed -z 's|^\./||' > "$list"
  how="find"
fi
count=$(tr -cd '\0' < "$list" | wc -c)
if [ "$count" -lt 10 ]; then
  echo "FAIL: only $count files found in $root ($how); is this the repository?"
  exit 1
fi
echo "checking $count files of $root ($how)"

failures=0
fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}

# grep over every listed file that still exists (a file deleted but not yet
# committed is skipped), text files only.
grep_all() {
  xargs -0 -r sh -c 'for f; do [ -f "$f" ] && printf "%s\0" "$f"; done' sh < "$list" |
    xargs -0 -r grep -HnIE "$@" --
}

# 1. Names of documents that are not in the repository. Each pattern is
#    spelled so that this file does not match it.
forbidden='NUMERIC[S][.]md|NUMERIC[S] [0-9]|ARCHITECTUR[E][.]md|STYL[E][.]md|DEVIC[E][.]md|[.][.]/share[d]|/wor[k]/'
hits=$(grep_all -e "$forbidden")
if [ -n "$hits" ]; then
  fail "files name documents or paths outside the repository (point into docs/ instead):"
  echo "$hits" | sed 's/^/    /'
else
  echo "ok: no file names a document outside the repository"
fi

# 2. Pointers into docs/numerics.md name headings it has.
headings=$(sed -nE 's/^#{1,6} +//p' "$numerics" | sed -E 's/ +$//')
pointer='docs/numerics[.]md, "[^"]+"((,| and| or|, and) "[^"]+")*'
checked=0
while IFS= read -r hit; do
  [ -z "$hit" ] && continue
  where=${hit%%:docs/numerics*}
  names=$(printf '%s\n' "${hit#"$where":}" | grep -oE '"[^"]+"' | tr -d '"')
  while IFS= read -r name; do
    checked=$((checked + 1))
    # A here-string, not printf | grep -q: grep -q stops at the first match, and
    # under pipefail the printf it leaves on a broken pipe fails the check.
    if ! grep -qxF -- "$name" <<< "$headings"; then
      fail "$where: docs/numerics.md has no heading \"$name\""
    fi
  done <<< "$names"
done < <(grep_all -o -e "$pointer")
# A pointer split over two lines cannot be checked: refuse it.
split=$(grep_all -e 'docs/numerics[.]md, *$|docs/numerics[.]md, "[^"]*$')
if [ -n "$split" ]; then
  fail "pointers into docs/numerics.md split across lines (keep 'docs/numerics.md, \"<heading>\"' on one line):"
  echo "$split" | sed 's/^/    /'
fi
if [ "$checked" -eq 0 ]; then
  fail "no pointer into docs/numerics.md found at all; the search itself is broken"
else
  echo "ok: checked $checked headings named by pointers into docs/numerics.md"
fi

# 3. Every docs/*.md named exists.
missing=0
while IFS= read -r hit; do
  [ -z "$hit" ] && continue
  doc=${hit##*:}
  if [ ! -f "$root/$doc" ]; then
    fail "${hit%:*}: names $doc, which does not exist"
    missing=$((missing + 1))
  fi
done < <(grep_all -o -e 'docs/[A-Za-z0-9_./-]+[.]md' | sort -u)
[ "$missing" -eq 0 ] && echo "ok: every docs/*.md named exists"

if [ "$failures" -gt 0 ]; then
  echo "$failures problem(s)"
  exit 1
fi
echo "PASS"
