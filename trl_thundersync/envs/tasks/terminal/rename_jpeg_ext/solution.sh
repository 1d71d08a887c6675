find photos -type f \( -name '*.jpeg' -o -name '*.JPEG' \) | while IFS= read -r f; do
    mv "$f" "${f%.*}.jpg"
done
