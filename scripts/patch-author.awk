# Print a `git format-patch` file, adding the header line `from` (awk -v from="From: NAME <EMAIL>")
# when the patch has no "From:" header. The committed patches name no person (export-patches.sh
# drops their author), and `git am` needs one: whoever applies them becomes their author.
#   awk -v from="From: $(git var GIT_COMMITTER_IDENT | sed 's/ [0-9]* [-+][0-9]*$//')" \
#       -f scripts/patch-author.awk PATCH | git am
NR == 1 { first = $0; next }
!body && /^From: / { has_author = 1 }
!body && $0 != "" { header[++n] = $0; next }
!body { flush(); body = 1 }
{ print }
END { if (!body && NR) flush() }
function flush(i) {
    print first
    if (!has_author) print from
    for (i = 1; i <= n; i++) print header[i]
}
