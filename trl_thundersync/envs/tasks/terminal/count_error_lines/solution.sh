awk '$2 == "ERROR"' app.log | wc -l > error_count.txt
