"""rfrs_ref.federated"""
