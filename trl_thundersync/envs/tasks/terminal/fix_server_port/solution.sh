awk '
  /^\[/ { section = $0 }
  section == "[server]" && /^port *=/ { print "port = 8080"; next }
  section == "[server]" && /^debug *=/ { print "debug = false"; next }
  { print }
' app.conf > app.conf.new && mv app.conf.new app.conf
