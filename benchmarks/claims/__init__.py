"""The papers' claims, each decided on a results store: OrMo's table, adaptive k, EA-wild, InHAD, the low-communication family, the advisor."""
