cut -d' ' -f1 access.log | sort -u | sort -t. -k1,1n -k2,2n -k3,3n -k4,4n > ips.txt
cut -d' ' -f1 access.log | sort | uniq -c | sort -k1,1nr | head -n1 | awk '{print $2}' > top_ip.txt
