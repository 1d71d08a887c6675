mkdir -p src
tar -xzf bundle.tar.gz -C src
find src -type f -name '*.txt' -exec sed -i 's/TODO/DONE/g' {} +
