#!/bin/sh
echo "coverage tools are not available in plait's offline build" >&2
exit 1
