mkdir -p bin
cat > bin/greet.sh <<'SCRIPT'
#!/bin/sh
if [ "$#" -lt 1 ]; then
    echo "usage: greet.sh NAME" >&2
    exit 2
fi
printf 'Hello, %s!\n' "$1"
SCRIPT
chmod +x bin/greet.sh
