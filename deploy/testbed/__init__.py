"""A wide-area testbed on one machine: hosts in network namespaces, links with delay and faults."""
