from django.dispatch import Signal

#: Sent by ``Order.pay()`` inside its transaction, with ``instance=<the order>``.
order_paid = Signal()
