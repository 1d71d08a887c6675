find data -type f -name '*.csv' | sort | tar -czf reports.tar.gz -T -
