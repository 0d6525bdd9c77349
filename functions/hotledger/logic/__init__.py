"""Domain logic: knows Redis scripts, the DB and the publisher only through hotledger.dal."""
