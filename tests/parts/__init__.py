"""One real part at a time: a real ZooKeeper, etcd, agent, HTTP server or Spark, the rest stand-ins."""
