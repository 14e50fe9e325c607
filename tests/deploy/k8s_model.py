"""What Kubernetes would make of rendered manifests, for k8s_manifests_test.py: label selectors,
resource quantities, and NetworkPolicy admission (may a pod reach a port of another pod?), with
the API's documented semantics. Only what the manifests use; anything else raises ValueError
rather than guessing.
"""

import re

_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}


def quantity(value):
    """A resource quantity ("500m", "8", "16Gi", 2) as a number (CPUs or bytes)."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {value!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def selects(selector, labels):
    """Whether a LabelSelector (matchLabels, matchExpressions) selects `labels`. An empty
    selector ({}) selects everything; None selects nothing."""
    if selector is None:
        return False
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise ValueError(f"unknown selector fields {unknown}")
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown operator {op}")
    return True


class Pod:
    """A pod as policies see it: namespace (with its labels), labels, container ports."""

    def __init__(self, namespace, labels, ports=(), namespace_labels=None):
        self.namespace = namespace
        self.labels = dict(labels)
        self.ports = list(ports)  # [{"name": ..., "containerPort": ..., "protocol": ...}]
        # Every namespace carries its name as a label (since Kubernetes 1.21).
        self.namespace_labels = dict(namespace_labels or {},
                                     **{"kubernetes.io/metadata.name": namespace})

    @staticmethod
    def of(workload):
        template = workload["spec"]["template"]
        ports = [p for c in template["spec"]["containers"] for p in c.get("ports", [])]
        return Pod(workload["metadata"]["namespace"], template["metadata"]["labels"], ports)


def _peer_admits(peer, policy_namespace, src):
    if "ipBlock" in peer:
        return False  # the manifests admit pods, never address ranges
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], src.namespace_labels):
            return False
    elif src.namespace != policy_namespace:
        return False  # a podSelector alone means the policy's own namespace
    return selects(peer.get("podSelector", {}), src.labels)


def _port_admits(rule_ports, dst, port, protocol):
    if not rule_ports:
        return True  # no ports: every port
    for p in rule_ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        want = p.get("port")
        if want is None:
            return True
        if isinstance(want, str):  # a named port of the destination's containers
            if any(c.get("name") == want and c["containerPort"] == port for c in dst.ports):
                return True
        elif want <= port <= p.get("endPort", want):
            return True
    return False


def ingress_allowed(policies, src, dst, port, protocol="TCP"):
    """May `src` open `port` on `dst`? A pod no Ingress policy selects admits everything; a
    selected pod admits what any of its policies' rules admit."""
    selecting = [p for p in policies
                 if p["metadata"]["namespace"] == dst.namespace
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and selects(p["spec"]["podSelector"], dst.labels)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            peer_ok = not peers or any(
                _peer_admits(peer, policy["metadata"]["namespace"], src) for peer in peers)
            if peer_ok and _port_admits(rule.get("ports"), dst, port, protocol):
                return True
    return False


def isolated(policies, pod):
    """Whether some Ingress policy selects `pod` (so that only what is listed gets in)."""
    return any(p["metadata"]["namespace"] == pod.namespace
               and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
               and selects(p["spec"]["podSelector"], pod.labels) for p in policies)
