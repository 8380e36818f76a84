"""What the tests share: helpers, certificates, a stand-in store, a slow agent."""
