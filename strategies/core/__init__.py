"""What every method is built from (a method's module imports from here, never the app).

* :mod:`~strategies.core.protocol`: the message vocabulary both halves share;
* :mod:`~strategies.core.settings`: a method's own run-config keys (:class:`Settings`);
* :mod:`~strategies.core.registry`: strategies by name, :class:`RunSetup`;
* :mod:`~strategies.core.client`: a method's client half (:class:`ClientUpdate`);
* :mod:`~strategies.core.base`: the two kinds of strategy (:class:`FlowerStrategy` in
  front of Flower's, :class:`PersonalizedStrategy` with a model per client);
* :mod:`~strategies.core.roster`, :mod:`~strategies.core.screening`,
  :mod:`~strategies.core.tracking`, :mod:`~strategies.core.history`,
  :mod:`~strategies.core.records`, :mod:`~strategies.core.replies`,
  :mod:`~strategies.core.layout`: who the clients are, how their replies are screened,
  the scenario, the run's records and their keys, reply checks, flat model vectors.
"""
