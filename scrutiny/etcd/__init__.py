"""etcd's v3 API messages, generated from protos/scrutiny/etcd (used by scrutiny.store.etcdkv alone)."""
