#!/usr/bin/env bash
# Checks that the default configuration file lists every setting of the
# daemon's settings table, commented out at its default, and nothing else.
# The table is read from `dfccld --help`, so the two cannot drift apart.
#
# Usage: check-conf.sh PATH-TO-DFCCLD PATH-TO-DFCCLD.CONF
set -euo pipefail

dfccld=$1
conf=$2

# "name<TAB>default" from the help text: a "  --name  help" line, then a
# line with "default 'VALUE'". The file cannot set 'config'.
table=$("$dfccld" --help | awk '
	/^  --[a-z]/ { name = substr($1, 3) }
	/default \047/ {
		v = $0; sub(/.*default \047/, "", v); sub(/\047.*/, "", v)
		if (name != "config") print name "\t" v
	}' | sort)
# The same from the file: "#name = value" lines (prose comments have a
# space after the '#').
file=$(sed -n 's/^#\([a-z][a-z0-9-]*\) =[[:space:]]*\(.*\)$/\1\t\2/p' "$conf" | sort)

if [ -z "$table" ]; then
	echo "check-conf: no settings found in '$dfccld --help'" >&2
	exit 1
fi
if [ "$table" != "$file" ]; then
	echo "check-conf: $conf does not match the settings of $dfccld:" >&2
	diff <(printf '%s\n' "$table") <(printf '%s\n' "$file") | sed 's/^</  dfccld --help:/; s/^>/  dfccld.conf:  /' >&2 || true
	exit 1
fi
echo "check-conf: $(printf '%s\n' "$file" | wc -l) settings match"
