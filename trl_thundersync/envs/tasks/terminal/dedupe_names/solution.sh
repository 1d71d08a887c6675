before=$(wc -l < names.txt)
awk '!seen[$0]++' names.txt > names.tmp && mv names.tmp names.txt
after=$(wc -l < names.txt)
echo $((before - after)) > removed.txt
