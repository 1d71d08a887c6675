python3 - <<'PY'
import json

users = json.load(open("users.json"))
emails = sorted({u["email"].lower() for u in users if u["active"]})
with open("active_emails.txt", "w") as out:
    out.write("".join(e + "\n" for e in emails))
domains = {}
for email in emails:
    domain = email.split("@", 1)[1]
    domains[domain] = domains.get(domain, 0) + 1
summary = {"active": sum(bool(u["active"]) for u in users), "inactive": sum(not u["active"] for u in users),
           "domains": domains}
json.dump(summary, open("summary.json", "w"), indent=2)
PY
