chmod 700 secrets
chmod 600 secrets/*
chmod 644 public/*
chmod 755 scripts/*.sh
