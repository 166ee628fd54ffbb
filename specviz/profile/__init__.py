"""This machine's profile and what an operator sets: the measured values that `python -m specviz.prepare` alone writes
and every other process only reads (store; what a process did with it: records), timing forwards by tokens fed
(cost_curve), a model pair's stored tree plan (tree_plans), and numbers set through environment variables
(environment). It may import decode/, backends/ and cpu/."""
